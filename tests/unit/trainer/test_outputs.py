"""A run owns its folders: a new run refuses another run's outputs, ``overwrite_output`` removes
exactly lrft's outputs, and a resume refuses a save path that another run's outputs hold."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest
import torch
import torch.distributed as dist

from lrft.api.errors import ConfigError
from lrft.api.protocols import TrainableModel
from lrft.cli import config_from_args
from lrft.config import TrainConfig
from lrft.dist import RankInfo
from lrft.run.checkpoint import save_checkpoint
from lrft.run.outputs import claim_outputs, own_outputs, read_run_id

MODEL = ["--pretrain=model", "--prompt_data=p.jsonl", "--reward_fn=math"]


class _Actor:
    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True)
        (directory / "weights").write_text("w")

    def load(self, directory: Path) -> None:
        del directory


def _checkpoint(root: Path, step: int, run_id: str | None) -> Path:
    manifest = {} if run_id is None else {"run_id": run_id}
    actor = cast(TrainableModel, _Actor())
    return save_checkpoint(root, step=step, actor=actor, manifest=manifest, max_keep=100)


def _config(save: Path, *flags: str) -> TrainConfig:
    return config_from_args(["train", *MODEL, f"--save_path={save}", *flags])


def _write(path: Path, text: str = "x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# Each of lrft's outputs, as the run that wrote it left it.
OUTPUTS: dict[str, Callable[[Path], Path]] = {
    "metrics": lambda save: _write(save / "metrics.jsonl", '{"step": 1, "kind": "train"}\n'),
    "tensorboard": lambda save: _write(save / "tensorboard" / "events.out.tfevents.1.host.7.0"),
    "curves": lambda save: _write(save / "curves.png"),
    "trajectories": lambda save: _write(save / "trajectories" / "step_00000001.jsonl"),
    "hf_model": lambda save: _write(save / "hf_model" / "model.safetensors"),
    "wandb": lambda save: _write(save / "wandb" / "offline-run-1-abc" / "run-abc.wandb"),
    "run": lambda save: _write(save / "run.json", '{"run_id": "a"}'),
    "checkpoint": lambda save: _checkpoint(save / "checkpoints", 8, "a"),
    "unfinished checkpoint": lambda save: _write(save / "checkpoints" / ".tmp-global_step2" / "x"),
}


def test_an_empty_or_missing_folder_and_unrelated_files_are_fine(tmp_path: Path) -> None:
    assert claim_outputs(_config(tmp_path / "missing"), rank=0) is None
    (tmp_path / "empty").mkdir()
    assert claim_outputs(_config(tmp_path / "empty"), rank=0) is None
    mine = tmp_path / "mine"
    _write(mine / "notes.txt")
    _write(mine / "demo_data" / "train.jsonl")  # the demo's prompts: written again identically
    _write(mine / "tensorboard" / "README")
    _write(mine / "checkpoints" / "best.pt")
    assert claim_outputs(_config(mine), rank=0) is None


@pytest.mark.parametrize("kind", sorted(OUTPUTS))
def test_a_new_run_refuses_a_folder_with_another_runs_output(tmp_path: Path, kind: str) -> None:
    written = OUTPUTS[kind](tmp_path)
    before = _tree(tmp_path)
    with pytest.raises(ConfigError) as error:
        claim_outputs(_config(tmp_path), rank=0)
    message = str(error.value)
    assert written.relative_to(tmp_path).parts[0] in message
    for way_out in ("--load_checkpoint", "fresh --save_path", "--overwrite_output"):
        assert way_out in message
    assert _tree(tmp_path) == before


def test_a_separate_checkpoint_folder_with_another_runs_checkpoints_is_refused(
    tmp_path: Path,
) -> None:
    _checkpoint(tmp_path / "shared", 16, "a")
    config = _config(tmp_path / "out", f"--ckpt_path={tmp_path / 'shared'}")
    with pytest.raises(ConfigError, match=r"global_step16.*--save_path and --ckpt_path"):
        claim_outputs(config, rank=0)


def test_the_message_names_checkpoints_by_step_and_counts_the_rest(tmp_path: Path) -> None:
    for step in (16, 8, 12, 4):
        _checkpoint(tmp_path / "checkpoints", step, "a")
    with pytest.raises(
        ConfigError, match=r"checkpoints/ \(global_step4, global_step8, global_step12, 1 more\)"
    ):
        claim_outputs(_config(tmp_path), rank=0)


def test_the_message_says_when_there_is_nothing_to_resume(tmp_path: Path) -> None:
    OUTPUTS["metrics"](tmp_path)
    with pytest.raises(ConfigError, match=r"--load_checkpoint \(it left no checkpoint"):
        claim_outputs(_config(tmp_path), rank=0)
    _checkpoint(tmp_path / "checkpoints", 8, "a")
    with pytest.raises(ConfigError) as error:
        claim_outputs(_config(tmp_path), rank=0)
    assert "left no checkpoint" not in str(error.value)


def test_overwrite_removes_exactly_lrfts_outputs_and_says_which(tmp_path: Path) -> None:
    for make in OUTPUTS.values():
        make(tmp_path)
    user = [
        _write(tmp_path / "notes.txt"),
        _write(tmp_path / "demo_data" / "train.jsonl"),
        _write(tmp_path / "tensorboard" / "README"),
        _write(tmp_path / "checkpoints" / "best.pt"),
        _write(tmp_path / "trajectories" / "mine.jsonl"),
    ]
    removed = claim_outputs(_config(tmp_path, "--overwrite_output"), rank=0)
    assert removed is not None
    for name in ("metrics.jsonl", "tensorboard/", "hf_model", "checkpoints/ (", "global_step8"):
        assert name in removed
    assert _tree(tmp_path) == sorted(
        {str(p.relative_to(tmp_path)) for p in user}
        | {"demo_data", "tensorboard", "checkpoints", "trajectories"}
    )
    assert claim_outputs(_config(tmp_path), rank=0) is None  # a new run may start now


def test_overwrite_leaves_the_folder_to_rank_zero(tmp_path: Path) -> None:
    OUTPUTS["metrics"](tmp_path)
    assert claim_outputs(_config(tmp_path, "--overwrite_output"), rank=1) is None
    assert (tmp_path / "metrics.jsonl").exists()
    assert claim_outputs(_config(tmp_path, "--overwrite_output"), rank=0) is not None
    assert not (tmp_path / "metrics.jsonl").exists()
    assert not (tmp_path / "checkpoints").exists()


def test_overwrite_and_resume_are_exclusive(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"load_checkpoint .* overwrite_output .* choose one"):
        _config(tmp_path, "--overwrite_output", "--load_checkpoint")


def test_a_resume_needs_its_checkpoint_and_the_outputs_to_be_one_runs(tmp_path: Path) -> None:
    resume = _config(tmp_path, "--load_checkpoint")
    assert claim_outputs(resume, rank=0) is None  # nothing yet: starts from step 0

    OUTPUTS["metrics"](tmp_path)
    with pytest.raises(ConfigError, match=r"found no checkpoint under .*metrics\.jsonl"):
        claim_outputs(resume, rank=0)

    _checkpoint(tmp_path / "checkpoints", 4, "a")
    with pytest.raises(ConfigError, match=r"run a's, but save_path .* of no recorded run"):
        claim_outputs(resume, rank=0)
    own_outputs(tmp_path, "b", rank=0)
    with pytest.raises(ConfigError, match=r"run a's, but save_path .* of run b: .*fresh"):
        claim_outputs(resume, rank=0)
    own_outputs(tmp_path, "a", rank=0)
    assert claim_outputs(resume, rank=0) is None


def test_a_copied_checkpoint_resumes_into_an_empty_save_path(tmp_path: Path) -> None:
    _checkpoint(tmp_path / "out" / "checkpoints", 2, "a")
    assert claim_outputs(_config(tmp_path / "out", "--load_checkpoint"), rank=0) is None


def test_a_checkpoint_from_before_run_ids_resumes_over_its_outputs(tmp_path: Path) -> None:
    OUTPUTS["metrics"](tmp_path)
    _checkpoint(tmp_path / "checkpoints", 4, None)
    assert claim_outputs(_config(tmp_path, "--load_checkpoint"), rank=0) is None


def test_the_run_file_names_the_run(tmp_path: Path) -> None:
    assert read_run_id(tmp_path) is None
    drawn = own_outputs(tmp_path, None, rank=0)
    assert len(drawn) == 16
    int(drawn, 16)  # hexadecimal
    assert read_run_id(tmp_path) == drawn
    assert json.loads((tmp_path / "run.json").read_text())["run_id"] == drawn
    assert own_outputs(tmp_path, "kept", rank=0) == "kept"
    assert read_run_id(tmp_path) == "kept"
    assert own_outputs(tmp_path / "other", None, rank=0) != drawn
    assert own_outputs(tmp_path / "rank1", None, rank=1)
    assert not (tmp_path / "rank1").exists()


def test_rerunning_the_demo_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """``lrft train`` twice into one folder: the second run stops before it writes the demo's
    prompt files or starts a process group."""
    save = tmp_path / "lrft_output"
    for kind in ("metrics", "tensorboard", "curves", "hf_model"):
        OUTPUTS[kind](save)
    before = _tree(save)
    info = RankInfo(
        rank=0, local_rank=0, world_size=1, local_world_size=1, device=torch.device("cpu")
    )
    from lrft.demos.apply import apply_demo_or_preset

    with pytest.raises(ConfigError, match=r"metrics\.jsonl, curves\.png, hf_model, tensorboard/"):
        apply_demo_or_preset(config_from_args(["train", f"--save_path={save}"]), info.rank)
    assert _tree(save) == before
    assert not dist.is_initialized()


def test_unreadable_records_are_refused_by_name(tmp_path: Path) -> None:
    _checkpoint(tmp_path / "checkpoints", 4, "a")
    _write(tmp_path / "run.json", "not json")
    with pytest.raises(ConfigError, match=r"run\.json does not name a run"):
        claim_outputs(_config(tmp_path, "--load_checkpoint"), rank=0)
    _write(tmp_path / "checkpoints" / "global_step4" / "manifest.json", "{torn")
    with pytest.raises(ConfigError, match=r"global_step4 has a manifest that cannot be read"):
        claim_outputs(_config(tmp_path, "--load_checkpoint"), rank=0)
