"""The hooks of ``RolloutEngineSuite``: supplied by a backend's subclass, read by the checks."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar, Generic, TypeVar

import torch

from lrft.api import RolloutEngine
from lrft.testing.distributed import DistributedSuite

E = TypeVar("E", bound=RolloutEngine)


class RolloutEngineHooks(DistributedSuite, abc.ABC, Generic[E]):
    """What a subclass of ``RolloutEngineSuite`` supplies: how to build the object under test,
    backdoors that read its state without the API under test, and the settings the checks read."""

    #: (attention heads, key/value heads) of the tiny test models (hidden size 64), for engines
    #: whose kernels need other shapes (vLLM's CPU attention needs head_dim >= 32: ``(2, 2)``)
    model_heads: ClassVar[tuple[int, int]] = (4, 2)
    #: the size of the TP groups the engines ``make_engine`` builds span (at most the engine's
    #: declared ``max_tp``, which the suite checks)
    tp_size: ClassVar[int] = 1
    #: the hypothesis state machine's budget: runs, and steps per run (raise them for a longer
    #: search, e.g. in a nightly job)
    lifecycle_examples: ClassVar[int] = 40
    lifecycle_steps: ClassVar[int] = 12

    @classmethod
    @abc.abstractmethod
    def make_engine(cls, model_dir: Path, device: torch.device) -> E:
        """An engine serving the Hugging Face folder ``model_dir`` on ``device`` (inside a rank).

        Called once per worker process; the suite reuses the engine across tests."""

    @classmethod
    @abc.abstractmethod
    def read_engine_weights(cls, engine: E) -> Mapping[str, torch.Tensor]:
        """Backdoor: every weight the engine holds, in Hugging Face names, read without its API
        (tied weights once)."""
