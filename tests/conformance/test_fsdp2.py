"""The ``fsdp2`` backend against the TrainBackend conformance suite: world 1, world 2, and world 2
with ``cpu_offload``; and a LoRA-wrapped model at world 1 and 2."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

from lrft.api import FrozenModel, TrainableModel
from lrft.backends.train.fsdp2 import FSDP2Backend, FSDP2Config, FSDP2TrainableModel
from lrft.testing.conformance.train import TrainBackendSuite
from lrft.testing.lora import LoraTrainModels


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class FSDP2Suite(TrainBackendSuite[FSDP2Backend]):
    @classmethod
    def make_backend(cls) -> FSDP2Backend:
        return FSDP2Backend(FSDP2Config(mixed_precision=False))

    @classmethod
    def parameter_shards(cls, model: FrozenModel) -> dict[str, torch.Tensor]:
        return {name: _local(p) for name, p in model.module.named_parameters()}

    @classmethod
    def optimizer_state(cls, model: TrainableModel) -> dict[str, torch.Tensor]:
        assert isinstance(model, FSDP2TrainableModel)
        names: dict[torch.Tensor, str] = {p: name for name, p in model.module.named_parameters()}
        return {
            f"{names[param]}:{key}": _local(value)
            for param, state in model.optimizer.state.items()
            for key, value in state.items()
            if key != "step"
        }

    @classmethod
    def gathered_parameters(cls, model: FrozenModel) -> dict[str, torch.Tensor]:
        return {name: _gathered(p) for name, p in model.module.named_parameters()}


@torch.no_grad()
def _gathered(param: torch.Tensor) -> torch.Tensor:
    if not isinstance(param, DTensor):
        return param
    # Host-resident shards (cpu_offload) are gathered where the process group can reach them.
    on_mesh_device = param.to(param.device_mesh.device_type)
    assert isinstance(on_mesh_device, DTensor)
    return on_mesh_device.full_tensor()


class TestFSDP2World1(FSDP2Suite):
    world_size = 1


class TestFSDP2World2(FSDP2Suite):
    world_size = 2


class TestFSDP2World4(FSDP2Suite):
    world_size = 4


class TestFSDP2CpuOffloadWorld2(FSDP2Suite):
    world_size = 2

    @classmethod
    def make_backend(cls) -> FSDP2Backend:
        return FSDP2Backend(FSDP2Config(mixed_precision=False, cpu_offload=True))


class TestFSDP2DeferredSyncWorld2(FSDP2Suite):
    """Deferred gradient reduction between micro-batches (the accumulation tests exercise it)."""

    world_size = 2

    @classmethod
    def make_backend(cls) -> FSDP2Backend:
        return FSDP2Backend(FSDP2Config(mixed_precision=False, defer_gradient_sync=True))


class TestFSDP2LoraWorld1(LoraTrainModels, FSDP2Suite):
    world_size = 1


class TestFSDP2LoraWorld2(LoraTrainModels, FSDP2Suite):
    world_size = 2
