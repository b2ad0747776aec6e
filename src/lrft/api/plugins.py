"""What ``lrft train`` hands a backend it builds by name.

A package adds a backend under one of the entry-point groups of :mod:`lrft.backends.registry`
(``lrft.rollout_engines``, ``lrft.train_backends``, ``lrft.weight_syncs``), naming a class:
``example = "my_package.engine:MyEngine"``. ``lrft train --engine_type example`` (likewise
``--train_backend``, ``--weight_sync``) then builds it with the class's ``from_spec`` classmethod,
given the spec of its kind below, on every rank; what it returns must satisfy the kind's Protocol
(:class:`~lrft.api.RolloutEngine`, :class:`~lrft.api.TrainBackend`,
:class:`~lrft.api.WeightSync`), which is checked, and whose conformance suite
(:mod:`lrft.testing.conformance`) the package runs in its own tests. lrft's own backends are
built the same way, through :mod:`lrft.backends.registry`.

A spec's ``options`` carry the settings of one backend alone (the hf engine's ``decode``, the
``memory_share`` an engine that reserves memory up front takes); a backend reads them into an
attrs class of its own with :func:`read_options`. Any other setting is the backend's own
business: its defaults, or its own environment variables.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import attrs
import torch

from lrft.api import validators as v
from lrft.api.errors import ConfigError

Options = TypeVar("Options", bound=attrs.AttrsInstance)


@attrs.frozen(kw_only=True)
class EngineSpec:
    """A rollout engine for one rank.

    ``model_dir``: the Hugging Face folder to serve (the actor's initial weights; every later
    weight comes through ``load_weights``/``weight_update``). ``device``: this rank's device.
    ``dtype``: the dtype the trainer computes logprobs in (bf16 on CUDA, fp32 on the CPU).
    ``tp_size``: the tensor-parallel group the engine spans (consecutive ranks; 1: this rank
    alone; an engine whose ``capabilities.max_tp`` is smaller is refused). ``max_batch_size``:
    the most sequences one ``generate`` call asks of this rank. ``max_model_len``: prompt plus
    response tokens at most (``None``: unbounded). ``seed``: the run's seed. ``options``: the
    engine's own settings by name (those its registry entry's facts call for; none for an
    engine that declares no facts).
    """

    model_dir: str
    device: torch.device
    dtype: torch.dtype
    tp_size: int = attrs.field(default=1, validator=v.positive_int)
    max_batch_size: int = attrs.field(validator=v.positive_int)
    max_model_len: int | None = None
    seed: int = 0
    options: Mapping[str, Any] = attrs.field(factory=dict, converter=v.read_only, hash=False)


@attrs.frozen(kw_only=True)
class TrainBackendSpec:
    """A train backend for one rank: ``device`` is this rank's device (torchrun's
    ``LOCAL_RANK``), ``seed`` the run's seed, ``options`` the backend's own settings by name
    (FSDP2's resharding, DeepSpeed's ZeRO stage; none for a package's backend). The optimizer
    and its schedule come later, with each ``prepare_trainable`` call."""

    device: torch.device
    seed: int = 0
    options: Mapping[str, Any] = attrs.field(factory=dict, converter=v.read_only, hash=False)


@attrs.frozen(kw_only=True)
class WeightSyncSpec:
    """A weight sync: ``bucket_bytes`` bounds one bucket of gathered weights; ``verify`` asks
    for the engine's digest to be compared with the trainer's after each sync; ``options``: the
    sync's own settings by name (the ``broadcast`` sync's process groups, ``groups``, under a
    split placement)."""

    bucket_bytes: int = attrs.field(validator=v.positive_int)
    verify: bool = True
    options: Mapping[str, Any] = attrs.field(factory=dict, converter=v.read_only, hash=False)


def read_options(
    options_type: type[Options], options: Mapping[str, Any], *, backend: str
) -> Options:
    """A spec's ``options`` as the attrs class ``options_type`` (its fields' defaults fill what
    is absent, its validators check what is there); a name it has no field for raises
    ``ConfigError`` naming ``backend`` and the names it takes."""
    known = tuple(attrs.fields_dict(options_type))
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ConfigError(
            f"{backend} takes no option {unknown[0]!r}; it takes {', '.join(known) or 'none'}"
        )
    return options_type(**options)
