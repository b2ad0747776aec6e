"""``broadcast`` weight sync from the fsdp2 backend on the trainer ranks into hf engines on the
rollout ranks of a split placement, on gloo: worlds of 2 (one trainer, one rollout rank), 3 (one
trainer and a TP group of 2; two trainers and one rollout rank) and 4 (two trainers, a TP group
of 2), from a LoRA source (merged weights) at world 2, a vision-language model at world 3, and
unverified at world 2."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from lrft.api import RolloutEngine, TrainableModel
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.backends.sync.broadcast import BroadcastSync
from lrft.backends.train.fsdp2 import FSDP2Backend, FSDP2Config
from lrft.dist import SplitGroups
from lrft.testing.conformance.split_sync import SplitWeightSyncSuite
from lrft.testing.lora import LoraSyncModels
from tests.conformance.test_direct_sync import fsdp2_full


class BroadcastSyncSuite(SplitWeightSyncSuite[BroadcastSync]):
    @classmethod
    def make_split_sync(cls, groups: SplitGroups, bucket_bytes: int) -> BroadcastSync:
        return BroadcastSync(groups=groups, bucket_bytes=bucket_bytes)

    @classmethod
    def make_train_backend(cls) -> FSDP2Backend:
        return FSDP2Backend(FSDP2Config(mixed_precision=False))

    @classmethod
    def make_engine(
        cls, model_dir: Path, dtype: torch.dtype, device: torch.device
    ) -> HFRolloutEngine:
        return HFRolloutEngine.from_pretrained(
            model_dir, config=HFEngineConfig(device=device, dtype=dtype)
        )

    @classmethod
    def read_engine_weights(cls, engine: RolloutEngine) -> Mapping[str, torch.Tensor]:
        assert isinstance(engine, HFRolloutEngine)
        return dict(engine.model.named_parameters())

    @classmethod
    def source_parameters(cls, source: TrainableModel) -> Mapping[str, torch.Tensor]:
        return {name: fsdp2_full(p) for name, p in source.module.named_parameters()}


class TestBroadcastSyncOneTrainerOneRollout(BroadcastSyncSuite):
    world_size = 2
    rollout_world_size = 1


class TestBroadcastSyncOneTrainerTP2(BroadcastSyncSuite):
    world_size = 3
    rollout_world_size = 2
    tp_size = 2
    vision = True


class TestBroadcastSyncTwoTrainersOneRollout(BroadcastSyncSuite):
    world_size = 3
    rollout_world_size = 1


class TestBroadcastSyncTwoTrainersTP2(BroadcastSyncSuite):
    world_size = 4
    rollout_world_size = 2
    tp_size = 2


class TestBroadcastSyncLora(LoraSyncModels, BroadcastSyncSuite):
    world_size = 2
    rollout_world_size = 1


class TestBroadcastSyncUnverified(BroadcastSyncSuite):
    """Without verification the report says ``verified=False`` and the corruption test skips."""

    world_size = 2
    rollout_world_size = 1

    @classmethod
    def make_split_sync(cls, groups: SplitGroups, bucket_bytes: int) -> BroadcastSync:
        return BroadcastSync(groups=groups, bucket_bytes=bucket_bytes, verify=False)
