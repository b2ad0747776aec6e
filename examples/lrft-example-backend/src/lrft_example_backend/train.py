"""``ExampleTrainBackend``: a ``TrainBackend`` that delegates to lrft's FSDP2 backend."""

from __future__ import annotations

import torch
from lrft.api import (
    FrozenModel,
    OptimizerConfig,
    SchedulerConfig,
    TrainableModel,
    TrainBackendSpec,
    TrainCapabilities,
)
from lrft.backends.train.fsdp2 import FSDP2Backend, FSDP2Config


class ExampleTrainBackend:
    """Sharded training by ``FSDP2Backend`` (fp32: the suites compare with an fp32 reference)."""

    def __init__(self) -> None:
        self._inner = FSDP2Backend(FSDP2Config(mixed_precision=False))

    @classmethod
    def from_spec(cls, spec: TrainBackendSpec) -> ExampleTrainBackend:
        """How ``lrft train --train_backend example`` builds it (lrft.api.plugins); the
        wrapped backend finds the rank's device itself."""
        return cls()

    @property
    def name(self) -> str:
        return "example"

    @property
    def capabilities(self) -> TrainCapabilities:
        return self._inner.capabilities

    @property
    def device(self) -> torch.device:
        return self._inner.device

    def prepare_trainable(
        self,
        model: torch.nn.Module,
        *,
        optimizer: OptimizerConfig,
        scheduler: SchedulerConfig | None = None,
    ) -> TrainableModel:
        return self._inner.prepare_trainable(model, optimizer=optimizer, scheduler=scheduler)

    def prepare_frozen(self, model: torch.nn.Module) -> FrozenModel:
        return self._inner.prepare_frozen(model)
