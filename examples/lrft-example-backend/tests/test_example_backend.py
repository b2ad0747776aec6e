"""The example backend through lrft's conformance suites: each class says how to build the
backend and how to read it without the API under test (the backdoor); the suites do the rest.

A suite's tests run on every rank of a pool of spawned processes (``world_size`` of them), so
these classes live at module level in an importable module. Run the same suites on GPUs with
``device_type = "cuda"`` (they skip where too few are visible).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from lrft.api import FrozenModel, RolloutEngine, TrainableModel
from lrft.backends.train.fsdp2 import FSDP2TrainableModel
from lrft.testing.conformance.rollout import RolloutEngineSuite
from lrft.testing.conformance.sync import WeightSyncSuite
from lrft.testing.conformance.train import TrainBackendSuite
from torch.distributed.tensor import DTensor

from lrft_example_backend import ExampleEngine, ExampleSync, ExampleTrainBackend


class TestExampleEngine(RolloutEngineSuite[ExampleEngine]):
    world_size = 1

    @classmethod
    def make_engine(cls, model_dir: Path, device: torch.device) -> ExampleEngine:
        return ExampleEngine.from_pretrained(model_dir, device=device)

    @classmethod
    def read_engine_weights(cls, engine: ExampleEngine) -> Mapping[str, torch.Tensor]:
        return engine.read_weights()


class TestExampleSync(WeightSyncSuite[ExampleSync]):
    world_size = 2

    @classmethod
    def make_sync(cls, bucket_bytes: int) -> ExampleSync:
        return ExampleSync(bucket_bytes=bucket_bytes)

    @classmethod
    def make_train_backend(cls) -> ExampleTrainBackend:
        return ExampleTrainBackend()

    @classmethod
    def make_engine(
        cls, model_dir: Path, dtype: torch.dtype, device: torch.device
    ) -> ExampleEngine:
        return ExampleEngine.from_pretrained(model_dir, device=device, dtype=dtype)

    @classmethod
    def read_engine_weights(cls, engine: RolloutEngine) -> Mapping[str, torch.Tensor]:
        assert isinstance(engine, ExampleEngine), f"not built by make_engine: {engine!r}"
        return engine.read_weights()


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class TestExampleTrainBackend(TrainBackendSuite[ExampleTrainBackend]):
    world_size = 2

    @classmethod
    def make_backend(cls) -> ExampleTrainBackend:
        return ExampleTrainBackend()

    @classmethod
    def parameter_shards(cls, model: FrozenModel) -> dict[str, torch.Tensor]:
        return {name: _local(p) for name, p in model.module.named_parameters()}

    @classmethod
    def optimizer_state(cls, model: TrainableModel) -> dict[str, torch.Tensor]:
        # the wrapped backend's handle: its optimizer is the backdoor to the moments
        assert isinstance(model, FSDP2TrainableModel), f"not an FSDP2 model: {model!r}"
        names: dict[torch.Tensor, str] = {p: name for name, p in model.module.named_parameters()}
        return {
            f"{names[param]}:{key}": _local(value)
            for param, state in model.optimizer.state.items()
            for key, value in state.items()
            if key != "step"
        }

    @classmethod
    @torch.no_grad()
    def gathered_parameters(cls, model: FrozenModel) -> dict[str, torch.Tensor]:
        return {
            name: p.full_tensor() if isinstance(p, DTensor) else p
            for name, p in model.module.named_parameters()
        }
