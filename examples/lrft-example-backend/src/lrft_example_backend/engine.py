"""``ExampleEngine``: a ``RolloutEngine`` that delegates to lrft's hf engine.

It does not inherit from the ``RolloutEngine`` Protocol (lrft's contracts are structural) nor from
the engine it wraps: it implements every member of the contract, under its own name, which the
errors it raises carry.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import torch
from lrft.api import (
    CapabilityNotSupported,
    EngineCapabilities,
    EnginePart,
    EngineSpec,
    EngineState,
    GenerationRequest,
    GenerationResult,
    NamedTensors,
    SamplingParams,
    TensorSpec,
    WeightLoader,
)
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine


class ExampleEngine:
    """Generation, memory states and weights, all by lrft's hf engine."""

    def __init__(self, inner: HFRolloutEngine) -> None:
        self._inner = inner

    @classmethod
    def from_pretrained(
        cls, model_dir: Path, *, device: torch.device, dtype: torch.dtype | None = None
    ) -> ExampleEngine:
        config = HFEngineConfig(device=device, dtype=dtype)
        return cls(HFRolloutEngine.from_pretrained(model_dir, config=config))

    @classmethod
    def from_spec(cls, spec: EngineSpec) -> ExampleEngine:
        """How ``lrft train --engine_type example`` builds it (lrft.api.plugins)."""
        return cls.from_pretrained(Path(spec.model_dir), device=spec.device, dtype=spec.dtype)

    @property
    def name(self) -> str:
        return "example"

    @property
    def capabilities(self) -> EngineCapabilities:
        return self._inner.capabilities

    @property
    def state(self) -> EngineState:
        return self._inner.state

    @property
    def weights_version(self) -> int | None:
        return self._inner.weights_version

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        with self._as_mine():
            return self._inner.generate(requests, params)

    def sleep(self, level: int) -> None:
        with self._as_mine():
            self._inner.sleep(level)

    def wake(
        self, parts: Collection[EnginePart] = (EnginePart.WEIGHTS, EnginePart.KV_CACHE)
    ) -> None:
        self._inner.wake(parts)

    def parameter_specs(self) -> Mapping[str, TensorSpec]:
        return self._inner.parameter_specs()

    def load_weights(self, named_tensors: NamedTensors, *, version: int) -> None:
        self._inner.load_weights(named_tensors, version=version)

    def weight_update(self, version: int) -> AbstractContextManager[WeightLoader]:
        # The hf engine's loader lends its storage (loads_in_place): passed on as it is.
        return self._inner.weight_update(version)

    def weights_digest(self) -> dict[str, str]:
        return self._inner.weights_digest()

    def shutdown(self) -> None:
        self._inner.shutdown()

    def __enter__(self) -> ExampleEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def read_weights(self) -> dict[str, torch.Tensor]:
        """The weights the engine serves from, for the conformance suites' backdoor."""
        return dict(self._inner.model.named_parameters())

    @contextmanager
    def _as_mine(self) -> Iterator[None]:
        # A refusal names the backend the caller asked: this one, not the engine it wraps.
        try:
            yield
        except CapabilityNotSupported as refused:
            raise CapabilityNotSupported(self.name, refused.capability) from refused
