"""The conformance suites on NCCL/CUDA at world 4: a TP 2 x DP 2 rollout layout, FSDP2 and
DeepSpeed ZeRO-3 sharded over four ranks, and weight sync from four-way sharded training into
each rank's engine (digest-verified). The DeepSpeed ZeRO-3 classes at world 4 live in
test_deepspeed_gpu.py beside the world-2 ones.

Skipped with a reason where fewer than four CUDA devices are visible (CI has none).
"""

from __future__ import annotations

from tests.conformance.test_direct_sync import DirectSyncSuite
from tests.conformance.test_fsdp2 import FSDP2Suite
from tests.conformance.test_hf_engine import HFEngineSuite
from tests.conformance.test_layout_hf import HFLayoutSuite


class TestLayoutCudaWorld4Tp2Dp2(HFLayoutSuite):
    world_size = 4
    device_type = "cuda"
    tp_size = 2


class TestFSDP2CudaWorld4(FSDP2Suite):
    world_size = 4
    device_type = "cuda"


class TestHFEngineCudaWorld4(HFEngineSuite):
    world_size = 4
    device_type = "cuda"


class TestDirectSyncCudaWorld4(DirectSyncSuite):
    world_size = 4
    device_type = "cuda"
