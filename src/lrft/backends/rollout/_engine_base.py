"""What every engine adapter (hf, vLLM) does the same way around its ``EngineLifecycle``.

:class:`EngineAdapter` holds the public surface of ``lrft.api.RolloutEngine`` that follows from
the lifecycle alone: state, version, specs and capabilities; ``sleep``, ``wake`` and
``shutdown`` as plan, the adapter's own move, record; ``load_weights`` as one whole update through
the adapter's ``weight_update``; the ``with`` block. An adapter supplies the moves (``_sleep``,
``_wake``, ``_release``), generation and its weight update. The helpers below are the other
choices both adapters make alike: their default device, and the caller's random streams left as
they were by a seeded generate.
"""

from __future__ import annotations

import abc
from collections.abc import Collection, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Self

import torch

from lrft.api.capabilities import EngineCapabilities
from lrft.api.protocols import NamedTensors, WeightLoader
from lrft.api.types import EnginePart, EngineState, TensorSpec
from lrft.backends.rollout._lifecycle import (
    EngineLifecycle,
    SleepPlan,
    WakePlan,
    validate_batch,
)


class EngineAdapter(abc.ABC):
    """The lifecycle side of a ``RolloutEngine``; a subclass sets ``_lifecycle`` when built."""

    _lifecycle: EngineLifecycle

    # --- description -------------------------------------------------------------------------

    @property
    def capabilities(self) -> EngineCapabilities:
        return self._lifecycle.capabilities

    @property
    def state(self) -> EngineState:
        return self._lifecycle.state

    @property
    def weights_version(self) -> int | None:
        return self._lifecycle.weights_version

    def parameter_specs(self) -> Mapping[str, TensorSpec]:
        return dict(self._lifecycle.specs)

    # --- memory ------------------------------------------------------------------------------

    def sleep(self, level: int) -> None:
        plan = self._lifecycle.plan_sleep(level)
        self._sleep(plan)
        self._lifecycle.finish_sleep(plan)

    def wake(
        self, parts: Collection[EnginePart] = (EnginePart.WEIGHTS, EnginePart.KV_CACHE)
    ) -> None:
        plan = self._lifecycle.plan_wake(parts)
        self._wake(plan)
        self._lifecycle.finish_wake(plan)

    @abc.abstractmethod
    def _sleep(self, plan: SleepPlan) -> None:
        """Free what ``plan`` says (the lifecycle records it once this returns)."""

    @abc.abstractmethod
    def _wake(self, plan: WakePlan) -> None:
        """Restore what ``plan`` says, the weights before the KV cache."""

    # --- weights -----------------------------------------------------------------------------

    def load_weights(self, named_tensors: NamedTensors, *, version: int) -> None:
        """One complete update; a refused batch changes nothing, freshness included."""
        self._lifecycle.check_weights_resident("load weights")
        batch = validate_batch(named_tensors, self._lifecycle.specs, self._lifecycle.aliases)
        with self.weight_update(version) as load:
            load(batch)

    @abc.abstractmethod
    def weight_update(self, version: int) -> AbstractContextManager[WeightLoader]: ...

    # --- teardown ----------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Free the engine's resources; idempotent."""
        if self._lifecycle.close():
            self._release()

    @abc.abstractmethod
    def _release(self) -> None:
        """Free the engine's resources (called once, by the first ``shutdown``)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()


def default_device() -> torch.device:
    """The current CUDA device where there is one, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@contextmanager
def caller_rng_kept(device: torch.device) -> Iterator[None]:
    """The host's random stream, and ``device``'s on CUDA, restored on exit: what a seeded
    generate draws (or seeds) inside never changes the caller's (the training's) randomness."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        yield
