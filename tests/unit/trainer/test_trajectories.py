"""Trajectory records against hand-computed values, and the files: atomic, one per saved step,
later steps removed when a run (re)starts at an earlier step."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from lrft.api.types import GenerationResult
from lrft.data import PromptSample
from lrft.rewards import RewardOutput
from lrft.trainer.experience import ExperienceBatch
from lrft.trainer.sequences import pack
from lrft.trainer.trajectories import (
    TrajectoryWriter,
    read_trajectories,
    sample_records,
    trajectory_file,
    trajectory_steps,
)

PROMPTS = [
    PromptSample(prompt_text="1+2=", prompt_token_ids=(5, 6), reference=3, source_index=11),
    PromptSample(prompt_text="4+4=", prompt_token_ids=(7, 8, 9), label="add", source_index=4),
]
OUTPUTS = [(20,), (21, 22), (23, 24, 25), (26,)]  # two samples per prompt
RESULTS = [
    GenerationResult(
        request_id=str(i // 2),
        sample_index=i % 2,
        prompt_token_ids=PROMPTS[i // 2].prompt_token_ids,
        output_token_ids=ids,
        finish_reason="length" if len(ids) == 3 else "stop",
    )
    for i, ids in enumerate(OUTPUTS)
]
# Per-token values, left-aligned to each response (the padding past a response's end is ignored).
ADVANTAGES = [[0.5, 9.0, 9.0], [-1.0, -2.0, 9.0], [1.0, 2.0, 6.0], [-0.25, 9.0, 9.0]]
OLD = [[-0.5, 0.0, 0.0], [-1.0, -0.25, 0.0], [-0.125, -0.25, -0.5], [-2.0, 0.0, 0.0]]
REF = [[-1.0, 0.0, 0.0], [-1.0, -0.75, 0.0], [-0.125, -0.25, -1.5], [-1.0, 0.0, 0.0]]


def _experience(with_reference: bool) -> ExperienceBatch:
    sequences = pack(RESULTS)
    return ExperienceBatch(
        sequences=sequences,
        old_logprobs=torch.tensor(OLD),
        ref_logprobs=torch.tensor(REF) if with_reference else None,
        scores=torch.tensor([1.0, 0.0, 0.5, 0.0]),
        advantages=torch.tensor(ADVANTAGES),
    )


def _records(with_reference: bool) -> list[dict[str, object]]:
    return sample_records(
        step=7,
        rank=1,
        prompts=PROMPTS,
        results=RESULTS,
        rewards=RewardOutput(
            scores=[1.0, 0.0, 0.5, 0.0], metrics={"extracted": [1.0, math.nan, 1.0, 0.0]}
        ),
        experience=_experience(with_reference),
        decode=lambda ids: "".join(chr(ord("a") + i - 20) for i in ids),
        kl_estimator="k1",
    )


def test_records_hold_each_sample_with_hand_computed_values() -> None:
    records = _records(with_reference=True)

    assert records[1] == {
        "step": 7,
        "rank": 1,
        "group": 0,
        "sample": 1,
        "prompt_index": 11,
        "prompt": "1+2=",
        "response": "bc",
        "prompt_tokens": 2,
        "response_tokens": 2,
        "finish_reason": "stop",
        "label": None,
        "reference": "3",
        "reward": 0.0,
        "reward_metrics": {"extracted": None},  # NaN: not measured
        "advantage": -1.5,  # (-1 - 2) / 2 tokens
        "logprob": -1.25,  # -1 - 0.25
        "kl": 0.25,  # k1 per token: (0 + 0.5) / 2
    }
    third = records[2]
    assert (third["group"], third["sample"], third["prompt_index"]) == (1, 0, 4)
    assert (third["label"], third["reference"], third["finish_reason"]) == ("add", None, "length")
    assert third["advantage"] == pytest.approx(3.0)  # (1 + 2 + 6) / 3
    assert third["logprob"] == pytest.approx(-0.875)
    assert third["kl"] == pytest.approx(1 / 3)  # (0 + 0 + 1) / 3
    assert [r["advantage"] for r in records] == pytest.approx([0.5, -1.5, 3.0, -0.25])
    assert [r["reward"] for r in records] == [1.0, 0.0, 0.5, 0.0]
    assert [r["response_tokens"] for r in records] == [1, 2, 3, 1]


def test_without_a_reference_there_is_no_kl() -> None:
    assert all("kl" not in record for record in _records(with_reference=False))


def test_results_must_be_whole_groups() -> None:
    with pytest.raises(ValueError, match="3 results are not a whole number per 2 prompts"):
        sample_records(
            step=1,
            rank=0,
            prompts=PROMPTS,
            results=RESULTS[:3],
            rewards=RewardOutput(scores=[0.0, 0.0, 0.0]),
            experience=_experience(False),
            decode=str,
            kl_estimator="k1",
        )


def test_files_are_written_per_step_and_read_back_in_step_order(tmp_path: Path) -> None:
    writer = TrajectoryWriter(tmp_path, every=2, rank=0)
    assert [step for step in range(1, 7) if writer.due(step)] == [2, 4, 6]
    for step in (10, 2, 4):
        writer.write(step, [{"step": step, "i": 0}, {"step": step, "i": 1}])

    assert trajectory_steps(tmp_path) == [2, 4, 10]
    assert trajectory_file(tmp_path, 4).name == "step_00000004.jsonl"
    assert [(r["step"], r["i"]) for r in read_trajectories(tmp_path)] == [
        (2, 0),
        (2, 1),
        (4, 0),
        (4, 1),
        (10, 0),
        (10, 1),
    ]
    assert not list(tmp_path.glob(".tmp-*"))


def test_restart_removes_later_steps_and_unfinished_writes(tmp_path: Path) -> None:
    writer = TrajectoryWriter(tmp_path, every=1, rank=0)
    for step in (1, 2, 3, 4):
        writer.write(step, [{"step": step}])
    (tmp_path / ".tmp-step_00000005.jsonl").write_text('{"step": 5')  # killed mid-write

    assert writer.discard_after(2) == [3, 4]
    assert trajectory_steps(tmp_path) == [1, 2]
    assert not list(tmp_path.glob(".tmp-*"))
    assert TrajectoryWriter(tmp_path, every=1, rank=0).discard_after(0) == [1, 2]
    assert trajectory_steps(tmp_path) == []


def test_only_rank_zero_touches_files(tmp_path: Path) -> None:
    TrajectoryWriter(tmp_path, every=1, rank=0).write(1, [{"step": 1}])
    other = TrajectoryWriter(tmp_path, every=1, rank=1)
    assert other.write(2, [{"step": 2}]) is None
    assert other.discard_after(0) == []
    assert trajectory_steps(tmp_path) == [1]


def test_non_finite_values_never_reach_the_file(tmp_path: Path) -> None:
    path = TrajectoryWriter(tmp_path, every=1, rank=0).write(3, _records(with_reference=True))
    assert path is not None

    def refuse(name: str) -> None:
        pytest.fail(f"{name} written to {path}")

    for line in path.read_text().splitlines():
        json.loads(line, parse_constant=refuse)


def test_every_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="every must be a positive number of steps, got 0"):
        TrajectoryWriter(tmp_path, every=0, rank=0)
