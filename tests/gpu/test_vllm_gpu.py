"""The vllm engine suites on CUDA (NCCL): real sleep levels, TP 2 across two GPUs.

Skipped with a reason where vllm or enough CUDA devices are missing.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (pip install 'lrft[vllm]')")

from tests.conformance.test_vllm_engine import VLLMDirectSyncSuite, VLLMEngineSuite


class TestVLLMEngineCudaWorld1(VLLMEngineSuite):
    world_size = 1
    device_type = "cuda"


class TestVLLMEngineCudaWorld2TP2(VLLMEngineSuite):
    world_size = 2
    tp_size = 2
    device_type = "cuda"


class TestVLLMDirectSyncCudaWorld1(VLLMDirectSyncSuite):
    world_size = 1
    device_type = "cuda"
