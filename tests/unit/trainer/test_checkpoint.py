"""Checkpoints: atomic directories, manifest, rotation, and an interrupted write."""

from __future__ import annotations

import random
from pathlib import Path
from typing import cast

import pytest
import torch

from lrft.api.errors import ConfigError
from lrft.api.protocols import TrainableModel
from lrft.run.checkpoint import (
    checkpoint_owner,
    checkpoint_steps,
    latest_checkpoint,
    load_checkpoint,
    read_manifest,
    save_checkpoint,
)


class FakeActor:
    """Writes and reads one tensor; ``fail_after`` makes ``save`` die half-way."""

    def __init__(self, value: float, *, fail: bool = False) -> None:
        self.value = torch.tensor([value])
        self.fail = fail

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "part1").write_text("x")
        if self.fail:
            raise OSError("disk full")
        torch.save(self.value, directory / "weights.pt")

    def load(self, directory: Path) -> None:
        self.value = torch.load(directory / "weights.pt")


def _actor(value: float, *, fail: bool = False) -> TrainableModel:
    return cast(TrainableModel, FakeActor(value, fail=fail))


def test_save_rotate_and_load(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step=step, actor=_actor(step), manifest={"k": step}, max_keep=2)
    assert checkpoint_steps(tmp_path) == [2, 3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step2", "global_step3"]
    latest = latest_checkpoint(tmp_path)
    assert latest == tmp_path / "global_step3"
    manifest = read_manifest(latest)
    assert (manifest["step"], manifest["k"]) == (3, 3)
    actor = FakeActor(0.0)
    load_checkpoint(latest, cast(TrainableModel, actor))
    assert actor.value.item() == 3.0


def test_rng_state_is_restored(tmp_path: Path) -> None:
    torch.manual_seed(1)
    random.seed(1)
    save_checkpoint(tmp_path, step=1, actor=_actor(1), manifest={}, max_keep=1)
    expected = (torch.rand(3), random.random())
    torch.manual_seed(99)
    random.seed(99)
    load_checkpoint(tmp_path / "global_step1", _actor(0))
    assert torch.equal(torch.rand(3), expected[0])
    assert random.random() == expected[1]


def test_an_interrupted_write_never_replaces_the_last_good_checkpoint(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, step=1, actor=_actor(1), manifest={}, max_keep=1)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, step=2, actor=_actor(2, fail=True), manifest={}, max_keep=1)
    assert latest_checkpoint(tmp_path) == tmp_path / "global_step1"
    assert not (tmp_path / "global_step2").exists()
    actor = FakeActor(0)
    load_checkpoint(tmp_path / "global_step1", cast(TrainableModel, actor))
    assert actor.value.item() == 1.0
    # The next write of that step clears the leftovers and completes.
    save_checkpoint(tmp_path, step=2, actor=_actor(2), manifest={}, max_keep=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step2"]


def test_rewriting_a_step_replaces_it_whole(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, step=1, actor=_actor(1), manifest={"v": 1}, max_keep=3)
    save_checkpoint(tmp_path, step=1, actor=_actor(5), manifest={"v": 2}, max_keep=3)
    assert read_manifest(tmp_path / "global_step1")["v"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step1"]


def test_the_critic_is_saved_and_restored_beside_the_actor(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, step=1, actor=_actor(1), manifest={}, max_keep=1, critic=_actor(7))
    actor, critic = FakeActor(0), FakeActor(0)
    load_checkpoint(
        tmp_path / "global_step1", cast(TrainableModel, actor), cast(TrainableModel, critic)
    )
    assert (actor.value.item(), critic.value.item()) == (1.0, 7.0)


def test_resuming_with_a_critic_from_a_run_without_one_is_refused(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "plain", step=1, actor=_actor(1), manifest={}, max_keep=1)
    with pytest.raises(ConfigError, match=r"has no critic, but this run trains one"):
        load_checkpoint(tmp_path / "plain" / "global_step1", _actor(0), _actor(0))
    save_checkpoint(
        tmp_path / "ppo", step=1, actor=_actor(1), manifest={}, max_keep=1, critic=_actor(2)
    )
    with pytest.raises(ConfigError, match=r"holds a critic, but this run trains none"):
        load_checkpoint(tmp_path / "ppo" / "global_step1", _actor(0))


def _owners(root: Path) -> dict[int, object]:
    return {step: checkpoint_owner(root / f"global_step{step}") for step in checkpoint_steps(root)}


def test_rotation_keeps_the_checkpoint_just_written_and_never_touches_another_run(
    tmp_path: Path,
) -> None:
    # Another run's checkpoints 8, 12, 16, then a new run writing every 4 steps, keeping 3.
    for step in (8, 12, 16):
        save_checkpoint(
            tmp_path, step=step, actor=_actor(step), manifest={"run_id": "a"}, max_keep=3
        )
    written = save_checkpoint(
        tmp_path, step=4, actor=_actor(4), manifest={"run_id": "b"}, max_keep=3
    )
    assert written.is_dir()
    assert _owners(tmp_path) == {4: "b", 8: "a", 12: "a", 16: "a"}
    for step in (5, 6, 7):
        save_checkpoint(
            tmp_path, step=step, actor=_actor(step), manifest={"run_id": "b"}, max_keep=3
        )
    # b keeps its newest three; a's are all still there
    assert _owners(tmp_path) == {5: "b", 6: "b", 7: "b", 8: "a", 12: "a", 16: "a"}


def test_rotation_keeps_the_checkpoint_just_written_below_newer_ones_of_its_run(
    tmp_path: Path,
) -> None:
    save_checkpoint(tmp_path, step=8, actor=_actor(8), manifest={"run_id": "a"}, max_keep=1)
    save_checkpoint(tmp_path, step=4, actor=_actor(4), manifest={"run_id": "a"}, max_keep=1)
    assert checkpoint_steps(tmp_path) == [4]


def test_a_step_held_by_another_run_is_refused_and_left_alone(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, step=12, actor=_actor(12), manifest={"run_id": "a"}, max_keep=3)
    with pytest.raises(ConfigError, match=r"written by run 'a', not by this run 'b'.*--ckpt_path"):
        save_checkpoint(tmp_path, step=12, actor=_actor(1), manifest={"run_id": "b"}, max_keep=3)
    actor = FakeActor(0)
    manifest = load_checkpoint(tmp_path / "global_step12", cast(TrainableModel, actor))
    assert (actor.value.item(), manifest["run_id"]) == (12.0, "a")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step12"]
