"""``direct`` weight sync from the fsdp2 backend into the hf engine, at world sizes 1, 2 and 4,
unverified (``verify=False``, which declares no ``verifies_digest``) at world 1, and from a LoRA
source (merged weights, changes only) at world 1 and 2, verified and not."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

from lrft.api import RolloutEngine, TrainableModel
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.backends.sync import DirectSync
from lrft.backends.train.fsdp2 import FSDP2Backend, FSDP2Config
from lrft.testing.conformance.sync import WeightSyncSuite
from lrft.testing.lora import LoraSyncModels


class FSDP2IntoHF:
    """The hooks of a sync suite from the fsdp2 backend into hf engines (also the broadcast
    sync's, ``test_broadcast_sync.py``)."""

    @classmethod
    def make_train_backend(cls) -> FSDP2Backend:
        return FSDP2Backend(FSDP2Config(mixed_precision=False))

    @classmethod
    def make_engine(
        cls, model_dir: Path, dtype: torch.dtype, device: torch.device
    ) -> HFRolloutEngine:
        config = HFEngineConfig(device=device, dtype=dtype)
        return HFRolloutEngine.from_pretrained(model_dir, config=config)

    @classmethod
    def read_engine_weights(cls, engine: RolloutEngine) -> Mapping[str, torch.Tensor]:
        assert isinstance(engine, HFRolloutEngine)
        return dict(engine.model.named_parameters())

    @classmethod
    def source_parameters(cls, source: TrainableModel) -> Mapping[str, torch.Tensor]:
        return {name: fsdp2_full(p) for name, p in source.module.named_parameters()}


class DirectSyncSuite(FSDP2IntoHF, WeightSyncSuite[DirectSync]):
    @classmethod
    def make_sync(cls, bucket_bytes: int) -> DirectSync:
        return DirectSync(bucket_bytes=bucket_bytes)


@torch.no_grad()
def fsdp2_full(param: torch.Tensor) -> torch.Tensor:
    """An FSDP2 parameter at full shape (collective for a sharded one)."""
    return param.full_tensor() if isinstance(param, DTensor) else param.detach()


class TestDirectSyncWorld1(DirectSyncSuite):
    world_size = 1


class TestDirectSyncWorld2(DirectSyncSuite):
    world_size = 2


class TestDirectSyncWorld4(DirectSyncSuite):
    world_size = 4


class TestDirectSyncUnverifiedWorld1(DirectSyncSuite):
    """Without verification: each bucket goes to the engine as gathered and the report says
    ``verified=False`` (the corruption tests skip: the sync declares no verifies_digest)."""

    world_size = 1

    @classmethod
    def make_sync(cls, bucket_bytes: int) -> DirectSync:
        return DirectSync(bucket_bytes=bucket_bytes, verify=False)


class TestDirectSyncLoraWorld1(LoraSyncModels, DirectSyncSuite):
    world_size = 1


class TestDirectSyncLoraWorld2(LoraSyncModels, DirectSyncSuite):
    world_size = 2


class TestDirectSyncLoraUnverifiedWorld1(LoraSyncModels, DirectSyncSuite):
    world_size = 1

    @classmethod
    def make_sync(cls, bucket_bytes: int) -> DirectSync:
        return DirectSync(bucket_bytes=bucket_bytes, verify=False)
