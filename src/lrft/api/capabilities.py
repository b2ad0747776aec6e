"""Capabilities are data: what a backend can do is declared, and tests require it by name.

Each capabilities record flattens into a set of names (``sleep_level_2``, ``offload_optimizer``,
...). Conformance tests ask for names, never for backend identities, and a backend that is asked
for something it did not declare raises :class:`~lrft.api.errors.CapabilityNotSupported`.
"""

from __future__ import annotations

import attrs

from lrft.api import validators as v
from lrft.api.errors import CapabilityNotSupported
from lrft.api.media import MODALITIES
from lrft.api.types import ModelPart


def _parts(values: object) -> frozenset[ModelPart]:
    if not isinstance(values, (set, frozenset, list, tuple)):
        raise TypeError(f"expected a collection of ModelPart, got {values!r}")
    return frozenset(ModelPart(x) for x in values)


def _levels(values: object) -> frozenset[int]:
    if not isinstance(values, (set, frozenset, list, tuple)):
        raise TypeError(f"expected a collection of sleep levels, got {values!r}")
    levels = frozenset(int(x) for x in values)
    if not levels <= {1, 2}:
        raise ValueError(f"sleep levels must be among {{1, 2}}, got {sorted(levels)}")
    return levels


@attrs.frozen(kw_only=True)
class TrainCapabilities:
    """What a ``TrainBackend`` can do.

    offload: the model parts ``offload``/``reload`` really move between device and host.
    mixed_precision: computes in a lower precision than the stored parameters (bf16 on GPU).
    checkpoint_resharding: a checkpoint saved at one world size loads at another.
    packed_sequences: its models run lrft's packed forwards (``lrft.models.packed_attention``):
        the wrapped module keeps the model's attention function and hands every forward keyword
        through to it, so a packed row's sequences attend only to themselves.
    sequence_parallel: packed forwards split across a sequence-parallel group train as the
        unsplit ones do: gradients are averaged over every rank of the default group, the
        group's ranks included (``lrft.dist.sequence_parallel``).
    """

    offload: frozenset[ModelPart] = attrs.field(factory=frozenset, converter=_parts)
    mixed_precision: bool = False
    checkpoint_resharding: bool = False
    packed_sequences: bool = False
    sequence_parallel: bool = False

    def names(self) -> frozenset[str]:
        names = {f"offload_{part.value}" for part in self.offload}
        flags = {
            "mixed_precision": self.mixed_precision,
            "checkpoint_resharding": self.checkpoint_resharding,
            "packed_sequences": self.packed_sequences,
            "sequence_parallel": self.sequence_parallel,
        }
        names.update(name for name, declared in flags.items() if declared)
        return frozenset(names)


@attrs.frozen(kw_only=True)
class EngineCapabilities:
    """What a ``RolloutEngine`` can do on the device it runs on now.

    sleep_levels: the lrft sleep levels it implements (1: KV cache freed, weights kept or parked;
        2: weights discarded as well).
    sleep_frees_memory: sleeping really returns device memory (false where the engine's sleep is
        a no-op, e.g. vLLM on CPU; the state machine still applies).
    max_tp: the largest tensor-parallel group it can span.
    returns_logprobs: it can return per-token logprobs.
    images: it generates from requests whose media hold images (``lrft.api.media``).
    audio: it generates from requests whose media hold audio clips.
    needs_cuda: it only runs on CUDA devices.
    loads_in_place: its ``weight_update`` yields an ``InPlaceWeightLoader``, which lends the
        storage the engine serves each weight from.
    """

    sleep_levels: frozenset[int] = attrs.field(factory=frozenset, converter=_levels)
    sleep_frees_memory: bool = False
    max_tp: int = attrs.field(default=1, validator=v.positive_number)
    returns_logprobs: bool = False
    images: bool = False
    audio: bool = False
    needs_cuda: bool = False
    loads_in_place: bool = False

    def names(self) -> frozenset[str]:
        names = {f"sleep_level_{level}" for level in self.sleep_levels}
        if self.sleep_frees_memory:
            names.add("sleep_frees_memory")
        if self.max_tp > 1:
            names.add("tensor_parallel")
        for flag in ("returns_logprobs", *MODALITIES, "needs_cuda", "loads_in_place"):
            if getattr(self, flag):
                names.add(flag)
        return frozenset(names)


@attrs.frozen(kw_only=True)
class SyncCapabilities:
    """What a ``WeightSync`` can do.

    verifies_digest: it compares the engine's digest of its own weights with the trainer's.
    cross_device: it reaches engines that live on other devices or processes.
    sends_changes_only: from an ``IncrementalWeightSource``, into an engine that still holds
        what the sync loaded last, it sends only the weights that changed (see ``WeightSync``).
    """

    verifies_digest: bool = False
    cross_device: bool = False
    sends_changes_only: bool = False

    def names(self) -> frozenset[str]:
        return frozenset(
            name
            for name in ("verifies_digest", "cross_device", "sends_changes_only")
            if getattr(self, name)
        )


def require(
    backend: str,
    capabilities: TrainCapabilities | EngineCapabilities | SyncCapabilities,
    name: str,
) -> None:
    """Raise :class:`CapabilityNotSupported` unless ``capabilities`` declares ``name``."""
    if name not in capabilities.names():
        raise CapabilityNotSupported(backend, name)
