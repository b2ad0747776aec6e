"""The broadcast weight sync's suite on NCCL: trainer and engines on GPUs of their own (skipped
where too few GPUs are visible)."""

from __future__ import annotations

from tests.conformance.test_broadcast_sync import BroadcastSyncSuite


class TestBroadcastSyncNCCLWorld2(BroadcastSyncSuite):
    device_type = "cuda"
    world_size = 2
    rollout_world_size = 1


class TestBroadcastSyncNCCLWorld4(BroadcastSyncSuite):
    device_type = "cuda"
    world_size = 4
    rollout_world_size = 2
    tp_size = 2
