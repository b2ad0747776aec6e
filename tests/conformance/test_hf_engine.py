"""The hf engine through the shared ``RolloutEngineSuite``, at world sizes 1 and 2, on its
default decoding path (``generate`` on CPU, the compiled CUDA-graph loop on CUDA) and on the
static loop without graphs (the loop's sampling, masking and stopping, checked on CPU)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import torch

from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.testing.conformance.rollout import RolloutEngineSuite


class HFEngineSuite(RolloutEngineSuite[HFRolloutEngine]):
    #: ``HFEngineConfig.decode`` of the engines under test
    decode: ClassVar[str] = "auto"

    @classmethod
    def make_engine(cls, model_dir: Path, device: torch.device) -> HFRolloutEngine:
        # Chunks of 3 sequences: the suite's batches of 5-8 span several generate calls.
        config = HFEngineConfig(device=device, max_batch_size=3, decode=cls.decode)
        return HFRolloutEngine.from_pretrained(model_dir, config=config)

    @classmethod
    def read_engine_weights(cls, engine: HFRolloutEngine) -> Mapping[str, torch.Tensor]:
        return dict(engine.model.named_parameters())


class TestHFEngineWorld1(HFEngineSuite):
    world_size = 1


class TestHFEngineWorld2(HFEngineSuite):
    world_size = 2


class TestHFEngineStaticDecodeWorld1(HFEngineSuite):
    world_size = 1
    decode = "static"
