"""Device memory is really released, through the shipped memory suites
(``lrft.testing.conformance.memory``): hf engine sleep levels 1 and 2, FSDP2 offload of
parameters and optimizer state, FSDP2's gather of full weights (at most a few buckets, nothing
after, exact), on a 2-GPU NCCL pool. ``test_gpu_memory_teeth.py`` shows the suites fail an
engine whose sleep and a backend whose offload keep the memory.

Skipped with a reason where fewer than two CUDA devices are visible (CI has none).
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import torch

from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.backends.train.fsdp2 import FSDP2Backend, FSDP2Config
from lrft.testing.conformance.memory import EngineMemorySuite, TrainMemorySuite


class HFEngineMemorySuite(EngineMemorySuite[HFRolloutEngine]):
    engine_class: ClassVar[type[HFRolloutEngine]] = HFRolloutEngine

    @classmethod
    def make_engine(cls, model_dir: Path, device: torch.device) -> HFRolloutEngine:
        config = HFEngineConfig(device=device, dtype=torch.float32, max_batch_size=64)
        return cls.engine_class.from_pretrained(model_dir, config=config)


class TestHFEngineMemoryCudaWorld2(HFEngineMemorySuite):
    world_size = 2


class FSDP2MemorySuite(TrainMemorySuite[FSDP2Backend]):
    @classmethod
    def make_backend(cls) -> FSDP2Backend:
        return FSDP2Backend(FSDP2Config())


class TestFSDP2MemoryCudaWorld2(FSDP2MemorySuite):
    world_size = 2
