"""``broadcast`` weight sync from the fsdp2 backend on the trainer ranks into hf engines on the
rollout ranks of a split placement, on gloo: worlds of 2 (one trainer, one rollout rank), 3 (one
trainer and a TP group of 2; two trainers and one rollout rank) and 4 (two trainers, a TP group
of 2), from a LoRA source (merged weights) at world 2, a vision-language model at world 3, and
unverified at world 2."""

from __future__ import annotations

from lrft.backends.sync.broadcast import BroadcastSync
from lrft.dist import SplitGroups
from lrft.testing.conformance.split_sync import SplitWeightSyncSuite
from lrft.testing.lora import LoraSyncModels
from tests.conformance.test_direct_sync import FSDP2IntoHF


class BroadcastSyncSuite(FSDP2IntoHF, SplitWeightSyncSuite[BroadcastSync]):
    @classmethod
    def make_split_sync(cls, groups: SplitGroups, bucket_bytes: int) -> BroadcastSync:
        return BroadcastSync(groups=groups, bucket_bytes=bucket_bytes)


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
