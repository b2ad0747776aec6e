"""The shipped memory suites have teeth on a GPU: an hf engine whose sleep only changes its
state, and an FSDP2 model whose offload only changes its placement, pass every CPU suite (on CPU
no memory moves anyway) and must fail here with a message giving the figures.

Skipped with a reason where fewer than two CUDA devices are visible (CI has none).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator

import pytest
import torch

from lrft.api import (
    EnginePart,
    FrozenModel,
    ModelPart,
    OptimizerConfig,
    Placement,
    SchedulerConfig,
    StepReport,
    TrainableModel,
    TrainCapabilities,
)
from lrft.backends.rollout.hf import HFRolloutEngine
from lrft.backends.train.fsdp2 import FSDP2Backend, FSDP2Config
from lrft.testing.distributed import DistributedSuite, RankFailure, RankPool
from tests.gpu.test_gpu_memory import FSDP2MemorySuite, HFEngineMemorySuite


class SleepsInNameOnly(HFRolloutEngine):
    """Moves through the states of sleep and wake, keeping every byte on the device."""

    def sleep(self, level: int) -> None:
        self._lifecycle.finish_sleep(self._lifecycle.plan_sleep(level))

    def wake(
        self, parts: Collection[EnginePart] = (EnginePart.WEIGHTS, EnginePart.KV_CACHE)
    ) -> None:
        self._lifecycle.finish_wake(self._lifecycle.plan_wake(parts))


class SleepsInNameOnlySuite(HFEngineMemorySuite):
    world_size = 2
    engine_class = SleepsInNameOnly


class _OffloadsInNameOnly:
    """An FSDP2 model whose ``offload`` and ``reload`` only record where the parts should be."""

    def __init__(self, model: TrainableModel) -> None:
        self._model = model
        self._on_host: set[ModelPart] = set()

    def __getattr__(self, name: str) -> object:
        return getattr(self._model, name)

    @property
    def module(self) -> torch.nn.Module:
        return self._model.module

    @property
    def placement(self) -> Placement:
        return self._model.placement

    def offload(self, parts: Collection[ModelPart]) -> None:
        self._on_host |= set(parts)

    def reload(self, parts: Collection[ModelPart]) -> None:
        self._on_host -= set(parts)

    def backward(self, loss: torch.Tensor, *, sync_gradients: bool = True) -> None:
        self._model.backward(loss, sync_gradients=sync_gradients)

    def step(self) -> StepReport:
        return self._model.step()

    def full_weights(
        self, bucket_bytes: int, *, gather_dtype: torch.dtype | None = None
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        return self._model.full_weights(bucket_bytes, gather_dtype=gather_dtype)


class _OffloadsInNameOnlyBackend:
    def __init__(self) -> None:
        self._inner = FSDP2Backend(FSDP2Config())

    name = "fsdp2"

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
        inner = self._inner.prepare_trainable(model, optimizer=optimizer, scheduler=scheduler)
        return _OffloadsInNameOnly(inner)  # type: ignore[return-value]  # forwards the rest

    def prepare_frozen(self, model: torch.nn.Module) -> FrozenModel:
        return self._inner.prepare_frozen(model)


class OffloadsInNameOnlySuite(FSDP2MemorySuite):
    world_size = 2

    @classmethod
    def make_backend(cls) -> FSDP2Backend:
        return _OffloadsInNameOnlyBackend()  # type: ignore[return-value]  # structurally one


class TestMemorySuitesTeethCudaWorld2(DistributedSuite):
    world_size = 2
    device_type = "cuda"

    def test_a_sleep_that_keeps_the_memory_fails(
        self, pool: RankPool, tmp_path_factory: pytest.TempPathFactory
    ) -> None:
        directory = tmp_path_factory.mktemp("memory-teeth-model")
        SleepsInNameOnlySuite.make_model().save_pretrained(directory)
        with pytest.raises(
            RankFailure, match=r"sleep\(1\) \(weights \w+\) freed -?\d+\.\d MiB of the"
        ):
            SleepsInNameOnlySuite().test_sleep_frees_device_memory(pool, directory)

    def test_an_offload_that_keeps_the_memory_fails(self, pool: RankPool) -> None:
        with pytest.raises(
            RankFailure,
            match=r"offload\(\[parameters, optimizer\]\) freed -?\d+\.\d MiB of the \d+\.\d MiB",
        ):
            OffloadsInNameOnlySuite().test_offload_frees_parameters_and_optimizer(pool)
