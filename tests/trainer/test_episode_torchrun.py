"""``torchrun --nproc_per_node 2 -m lrft train --environment ...`` on gloo, with FSDP2 and with
DeepSpeed ZeRO-3: episodes with an observation between two turns train, evaluate, export and
save their turns; every saved score is recomputed from the saved texts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lrft.rewards import RewardSample
from lrft.trainer.trajectories import read_trajectories
from tests.trainer.episode_env import FIRST_TURN_REWARD, OBSERVATION
from tests.trainer.fixtures import base_args, digit_fraction, make_model_folder, make_prompt_files
from tests.trainer.test_torchrun import _run


def digit_fraction_of(text: str) -> float:
    return digit_fraction(RewardSample(prompt="", response=text))


EPISODES = [
    "--environment=tests.trainer.episode_env:Relay",
    "--max_turns=3",
    "--max_episode_tokens=32",
    "--save_trajectories",
    "--use_tis",
    "--init_kl_coef=0.01",
    "--max_steps=2",
]


def check_relay_run(save: Path, model: Path, *, samples: int) -> None:
    """A finished ``EPISODES`` run in ``save``: its ``samples`` trajectories each hold the two
    turns and the observation, every score is recomputed from the saved texts, two steps
    trained on two-turn episodes and evaluated at 0 and 2, and the export moved."""
    records = read_trajectories(save / "trajectories")
    assert len(records) == samples
    for record in records:
        first, last = record["turns"]
        assert record["episode_end"] == "done"
        assert first["observation"] == OBSERVATION
        assert first["reward"] == FIRST_TURN_REWARD
        assert record["response"] == first["model"] + OBSERVATION + last["model"]
        expected = FIRST_TURN_REWARD + digit_fraction_of(last["model"])
        assert record["reward"] == pytest.approx(expected)

    rows = [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]
    train_rows = [row for row in rows if row["kind"] == "train"]
    assert [row["step"] for row in train_rows] == [1, 2]
    for row in train_rows:
        assert row["episode/turns"] == 2.0
        assert row["episode/observation_tokens"] == len(OBSERVATION)
        assert math.isfinite(row["policy/policy_loss"])
        assert math.isfinite(row["kl"])
    assert [row["step"] for row in rows if row["kind"] == "eval"] == [0, 2]

    exported = load_file(save / "hf_model" / "model.safetensors")
    initial = load_file(model / "model.safetensors")
    # in the export's dtype: a run on CUDA exports the bf16 it trained in
    changed = [k for k in initial if not torch.equal(exported[k], initial[k].to(exported[k].dtype))]
    assert changed, "training did nothing"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("episode_inputs")
    train, held_out = make_prompt_files(root / "data")
    return make_model_folder(root / "model"), train, held_out


@pytest.mark.parametrize("backend", [[], ["--zero_stage=3"]], ids=["fsdp2", "zero3"])
def test_episodes_train_on_two_ranks(
    inputs: tuple[Path, Path, Path], tmp_path: Path, backend: list[str]
) -> None:
    model, train, held_out = inputs
    save = tmp_path / "out"
    result = _run([*base_args(model, train, held_out, save), *EPISODES, *backend])
    assert result.returncode == 0, result.stderr[-3000:]

    check_relay_run(save, model, samples=2 * 4 * 4)  # steps x prompts x samples
