"""W&B, trajectories and the console of ``torchrun --nproc_per_node 2 -m lrft train``, through a
checkpoint and a resume: W&B (offline, read back by wandb's own reader) holds what the metrics
JSONL holds, in one run id across the resume; the saved trajectories agree with an independent
recomputation of the reward and of GRPO's advantages, and no step is kept twice."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from lrft.run.checkpoint import read_manifest
from lrft.run.metrics import read_metrics
from lrft.run.outputs import TRAJECTORY_DIR
from lrft.trainer.trajectories import read_trajectories, trajectory_file
from tests.trainer.fixtures import base_args, make_model_folder, make_prompt_files
from tests.trainer.test_torchrun import _run
from tests.trainer.wandb_offline import OFFLINE_ENV, history, offline_runs, only, read_records

pytest.importorskip("wandb", reason="needs wandb (pip install 'lrft[wandb]')")

GROUP_STD_EPS = 1e-6  # AdvantageParams' default, which the trainer uses
OBSERVED = [
    "--save_trajectories",
    "--use_wandb",
    "--wandb_project=observability",
    "--wandb_group=tests",
    "--wandb_run_name=resumed",
    "--save_steps=2",
    "--no-save_hf_model",
]


def _merged_by_step(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    rows: dict[int, dict[str, Any]] = defaultdict(dict)
    for record in records:
        rows[record["step"]].update({k: v for k, v in record.items() if k not in ("step", "kind")})
    return dict(rows)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A run of 3 steps with a checkpoint at step 2, then a resume that runs to step 4."""
    root = tmp_path_factory.mktemp("observability")
    train, held_out = make_prompt_files(root / "data")
    model = make_model_folder(root / "model")
    save = root / "out"
    args = [*base_args(model, train, held_out, save), *OBSERVED]
    env = {**OFFLINE_ENV, "WANDB_DIR": ""}  # empty: wandb's files go under SAVE_PATH
    first = _run([*args, "--max_steps=3"], **env)
    assert first.returncode == 0, first.stderr[-3000:]
    first_lines = (save / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    first_files = {
        step: trajectory_file(save / TRAJECTORY_DIR, step).read_bytes() for step in (1, 2, 3)
    }
    resumed = _run([*args, "--max_steps=4", "--load_checkpoint"], **env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # The resume drops the lines of step 3, which it logs again; those before stay byte for byte.
    before = [line for line in first_lines if json.loads(line)["step"] <= 2]
    assert len(before) < len(first_lines)
    lines = (save / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    assert lines[: len(before)] == before
    metrics = read_metrics(save / "metrics.jsonl")
    steps = [(r["step"], r["kind"]) for r in metrics]
    assert len(steps) == len(set(steps)), steps
    return {
        "save": save,
        "first": first,
        "resumed": resumed,
        "first_metrics": [json.loads(line) for line in first_lines],
        "resumed_metrics": metrics[len(before) :],
        "first_files": first_files,
    }


def test_wandb_runs_hold_the_jsonl_metrics_in_one_run_across_the_resume(
    job: dict[str, Any],
) -> None:
    save: Path = job["save"]
    runs = offline_runs(save / "wandb")
    assert len(runs) == 2, runs
    first, resumed = (read_records(run) for run in runs)

    assert history(first) == _merged_by_step(job["first_metrics"])
    assert sorted(history(first)) == [0, 1, 2, 3]  # eval at 0, steps 1-3 (eval again at 3)
    assert history(resumed) == _merged_by_step(job["resumed_metrics"])
    assert sorted(history(resumed)) == [3, 4]

    run_id = only(first, "run")["run_id"]
    assert read_manifest(save / "checkpoints" / "global_step2")["wandb_run_id"] == run_id
    assert only(resumed, "run")["run_id"] == run_id
    assert only(resumed, "run")["resume"] is True
    run = only(first, "run")
    assert (run["project"], run["run_group"], run["display_name"]) == (
        "observability",
        "tests",
        "resumed",
    )
    config = run["config"]["update"]
    assert (config["seed"], config["n_samples_per_prompt"], config["use_wandb"]) == (42, 4, True)
    assert only(first, "exit")["exit_code"] == 0
    assert only(resumed, "exit")["exit_code"] == 0


def test_trajectories_match_an_independent_recomputation_and_no_step_twice(
    job: dict[str, Any],
) -> None:
    save: Path = job["save"]
    records = read_trajectories(save / TRAJECTORY_DIR)
    steps = [r["step"] for r in records]
    assert sorted(set(steps)) == [1, 2, 3, 4]
    assert all(steps.count(step) == 16 for step in (1, 2, 3, 4))  # 4 prompts x 4 samples
    assert {(r["step"], r["rank"]) for r in records} == {
        (s, k) for s in range(1, 5) for k in (0, 1)
    }
    for step in (1, 2):  # written before the checkpoint: the resumed run left them alone
        assert (
            trajectory_file(save / TRAJECTORY_DIR, step).read_bytes() == (job["first_files"][step])
        )
    # Step 3 was redone after the resume; resume is exact, so it is the same iteration again.
    assert trajectory_file(save / TRAJECTORY_DIR, 3).read_bytes() == job["first_files"][3]

    groups: dict[tuple[int, int, int], list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        # The run's reward (tests.trainer.fixtures:digit_fraction), recomputed from the text.
        text = record["response"]
        expected = sum(c.isdigit() for c in text) / len(text) if text else 0.0
        assert record["reward"] == pytest.approx(expected, abs=1e-6), record
        groups[(record["step"], record["rank"], record["group"])].append(record)
    assert len(groups) == 4 * 4
    for members in groups.values():
        assert sorted(m["sample"] for m in members) == [0, 1, 2, 3]
        rewards = [m["reward"] for m in members]
        mean, std = statistics.fmean(rewards), statistics.stdev(rewards)
        for member, reward in zip(members, rewards, strict=True):
            grpo = (reward - mean) / (std + GROUP_STD_EPS)
            assert member["advantage"] == pytest.approx(grpo, abs=1e-4), members

    train_rows = {
        r["step"]: r for r in job["first_metrics"] + job["resumed_metrics"] if r["kind"] == "train"
    }
    for step in (1, 2, 3, 4):
        logged = [r["reward"] for r in records if r["step"] == step]
        assert statistics.fmean(logged) == pytest.approx(train_rows[step]["train/reward_mean"])


def test_a_pipe_gets_one_plain_line_per_step(job: dict[str, Any]) -> None:
    out = job["first"].stdout
    for step in (1, 2, 3):
        assert f"step {step}/3  reward " in out
    assert "\r" not in out
    assert "resumed from" in job["resumed"].stdout
    assert "step 4/4  reward " in job["resumed"].stdout
