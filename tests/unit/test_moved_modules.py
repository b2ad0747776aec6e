"""Modules that moved keep their old import path for one release: the old name hands out the
very objects of the new home."""

from __future__ import annotations

import importlib

import pytest

MOVED = {
    "lrft.trainer.config": "lrft.config",
    "lrft.trainer.demo": "lrft.demos",
    "lrft.trainer.presets": "lrft.presets",
    "lrft.trainer.resume": "lrft.run.resume",
    "lrft.trainer.checkpoint": "lrft.run.checkpoint",
    "lrft.trainer.vision_critic": "lrft.models.vision_critic",
}


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_the_old_path_serves_the_new_homes_objects(old: str, new: str) -> None:
    before, after = importlib.import_module(old), importlib.import_module(new)
    names = getattr(after, "__all__", None) or [n for n in vars(after) if not n.startswith("_")]
    public = [name for name in names if not isinstance(getattr(after, name), type(importlib))]
    assert public, f"{new} exports nothing"
    for name in public:
        assert getattr(before, name) is getattr(after, name), f"{old}.{name}"


def test_the_trainer_package_still_exports_its_names() -> None:
    import lrft.trainer as trainer
    from lrft.config import TrainConfig
    from lrft.models.critic import load_critic
    from lrft.run.checkpoint import latest_checkpoint

    assert trainer.TrainConfig is TrainConfig
    assert trainer.load_critic is load_critic
    assert trainer.latest_checkpoint is latest_checkpoint
