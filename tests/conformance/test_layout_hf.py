"""TP/DP groups and TP-group generation with the hf engine: world 2 (TP 2) and world 4 (TP 2)."""

from __future__ import annotations

from pathlib import Path

from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.testing.conformance.layout import RolloutLayoutSuite
from lrft.testing.distributed import current_rank_context


class HFLayoutSuite(RolloutLayoutSuite[HFRolloutEngine]):
    @classmethod
    def make_engine(cls, model_dir: Path) -> HFRolloutEngine:
        config = HFEngineConfig(device=current_rank_context().device)
        return HFRolloutEngine.from_pretrained(model_dir, config=config)


class TestLayoutWorld2Tp2(HFLayoutSuite):
    world_size = 2
    tp_size = 2


class TestLayoutWorld4Tp2(HFLayoutSuite):
    world_size = 4
    tp_size = 2


class TestLayoutWorld4Tp1(HFLayoutSuite):
    world_size = 4
    tp_size = 1
