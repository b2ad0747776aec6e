"""The conformance suites on NCCL/CUDA at world 2 (the hf engine and the direct sync at world 1
too): the same tests as tests/conformance, on GPUs.

Skipped with a reason where too few CUDA devices are visible (CI has none).
"""

from __future__ import annotations

from tests.conformance.test_direct_sync import DirectSyncSuite
from tests.conformance.test_fsdp2 import FSDP2Suite
from tests.conformance.test_hf_engine import HFEngineSuite
from tests.conformance.test_layout_hf import HFLayoutSuite


class TestFSDP2CudaWorld2(FSDP2Suite):
    world_size = 2
    device_type = "cuda"


class TestHFEngineCudaWorld1(HFEngineSuite):
    """The default CUDA path (static cache, CUDA graphs) on one GPU."""

    world_size = 1
    device_type = "cuda"


class TestHFEngineCudaWorld2(HFEngineSuite):
    world_size = 2
    device_type = "cuda"


class TestDirectSyncCudaWorld1(DirectSyncSuite):
    """One rank: the sync writes each bucket straight into the engine's storage through the
    fused cast-and-fingerprint kernel."""

    world_size = 1
    device_type = "cuda"


class TestDirectSyncCudaWorld2(DirectSyncSuite):
    world_size = 2
    device_type = "cuda"


class TestLayoutCudaWorld2Tp2(HFLayoutSuite):
    world_size = 2
    device_type = "cuda"
    tp_size = 2
