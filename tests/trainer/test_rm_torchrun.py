"""``lrft train-rm`` end to end as users run it: under ``torchrun --nproc_per_node 2`` a run
stopped at its checkpoint and resumed ends bit-identical to one that ran straight; the built-in
demo learns its synthetic preferences to >= 90% held-out pair accuracy, and its exported reward
model then drives ``lrft train --reward_pretrain`` on the demo task, scoring each response as a
plain transformers forward of the exported folder does and preferring the right answers."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from lrft.demos.model import ASSETS_DIR
from lrft.demos.task import AdditionTask, is_correct, write_jsonl
from lrft.rm.demo import preference_rows
from lrft.run.metrics import read_metrics
from tests.trainer.fixtures import make_model_folder

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    paths = [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, paths)), OMP_NUM_THREADS="1")


def _run(args: list[str], *, ranks: int = 1) -> subprocess.CompletedProcess[str]:
    if ranks == 1:
        command = [sys.executable, "-m", "lrft", *args]
    else:
        port = str(29300 + os.getpid() % 300)
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks)]
        command = [*torchrun, "--master_port", port, "-m", "lrft", *args]
    return subprocess.run(
        command, env=_env(), capture_output=True, text=True, timeout=600, check=False
    )


def test_a_resumed_run_ends_bit_identical_to_a_straight_one(tmp_path: Path) -> None:
    model = make_model_folder(tmp_path / "model")
    rows = preference_rows(AdditionTask(num_train=60, num_eval=8).train_problems(), seed=0)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(row) + "\n" for row in rows[:32]))
    common = [
        "train-rm",
        f"--pretrain={model}",
        f"--dataset={pairs}",
        "--train_batch_size=8",
        "--micro_train_batch_size=2",
        "--learning_rate=1e-3",
        "--max_epochs=1",
        "--save_steps=2",
    ]
    straight = _run([*common, f"--save_path={tmp_path / 'straight'}"], ranks=2)
    assert straight.returncode == 0, straight.stderr[-3000:]
    first = _run([*common, f"--save_path={tmp_path / 'split'}", "--max_steps=2"], ranks=2)
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = _run([*common, f"--save_path={tmp_path / 'split'}", "--load_checkpoint"], ranks=2)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout
    assert "at step 2" in resumed.stdout

    a = load_file(tmp_path / "straight" / "hf_model" / "model.safetensors")
    b = load_file(tmp_path / "split" / "hf_model" / "model.safetensors")
    assert a.keys() == b.keys()
    assert "score.weight" in a
    for name in a:
        assert torch.equal(a[name], b[name]), name
    straight_log = [
        r for r in read_metrics(tmp_path / "straight" / "metrics.jsonl") if r["kind"] == "train"
    ]
    split_log = [
        r for r in read_metrics(tmp_path / "split" / "metrics.jsonl") if r["kind"] == "train"
    ]
    assert [r["step"] for r in split_log] == [1, 2, 3, 4]  # each step logged once
    assert [r["train/loss"] for r in split_log] == [r["train/loss"] for r in straight_log]


@pytest.fixture(scope="module")
def demo_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The built-in demo, shortened: 150 of its 426 steps; its folder and its output."""
    save = tmp_path_factory.mktemp("rm_demo")
    done = _run(["train-rm", f"--save_path={save}", "--max_steps=150", "--eval_steps=150"])
    assert done.returncode == 0, done.stderr[-3000:]
    return save, done


@pytest.fixture(scope="module")
def demo_rm(demo_run: tuple[Path, subprocess.CompletedProcess[str]]) -> Path:
    return demo_run[0]


def test_the_demo_writes_curves_tensorboard_and_a_closing_summary(
    demo_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    save, done = demo_run
    evals = [r for r in read_metrics(save / "metrics.jsonl") if r["kind"] == "eval"]
    first, last = evals[0]["eval/accuracy"], evals[-1]["eval/accuracy"]
    lines = done.stdout.splitlines()
    assert lines[-1].startswith("done: 150 steps in ")
    assert lines[-1].endswith(f"s; held-out accuracy {first:.3f} -> {last:.3f}")
    if importlib.util.find_spec("matplotlib") is not None:
        assert f"curves written to {save / 'curves.png'}" in lines
        assert (save / "curves.png").stat().st_size > 0
    if importlib.util.find_spec("tensorboard") is not None:  # the demo's default, as lrft train's
        assert f"TensorBoard logs in {save / 'tensorboard'}" in lines
        assert list((save / "tensorboard").glob("events.out.tfevents.*"))
    # the new score head: one quiet line, no MISSING report
    assert "MISSING" not in done.stdout + done.stderr
    assert sum("the score head is new" in line for line in lines) == 1


def test_the_demo_learns_its_preferences(demo_rm: Path) -> None:
    evals = [r for r in read_metrics(demo_rm / "metrics.jsonl") if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 150]
    assert evals[0]["eval/accuracy"] < 0.7
    assert evals[-1]["eval/accuracy"] >= 0.9


def test_the_exported_model_drives_lrft_train(demo_rm: Path, tmp_path: Path) -> None:
    task = AdditionTask(num_train=64, num_eval=8)
    train = write_jsonl(tmp_path / "train.jsonl", task.train_problems())
    folder = demo_rm / "hf_model"
    run = _run(
        [
            "train",
            f"--pretrain={ASSETS_DIR}",
            f"--prompt_data={train}",
            "--reference_key=answer",
            f"--reward_pretrain={folder}",
            "--n_samples_per_prompt=8",
            "--rollout_batch_size=8",
            "--micro_rollout_batch_size=8",
            "--train_batch_size=32",
            "--micro_train_batch_size=16",
            "--generate_max_len=5",
            "--actor_learning_rate=1e-4",
            "--max_steps=2",
            "--save_trajectories",
            "--no-save_hf_model",
            f"--save_path={tmp_path / 'rl'}",
        ]
    )
    assert run.returncode == 0, run.stderr[-3000:]
    records = [
        json.loads(line)
        for path in sorted((tmp_path / "rl" / "trajectories").glob("step_*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    assert len(records) == 2 * 64
    model = AutoModelForSequenceClassification.from_pretrained(folder)
    torch.nn.Module.eval(model)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    right: list[float] = []
    wrong: list[float] = []
    for record in records[:32]:
        ids = torch.tensor([tokenizer.encode(record["prompt"] + record["response"])])
        with torch.no_grad():
            plain = float(model(input_ids=ids).logits[0, 0])
        assert record["reward"] == pytest.approx(plain, abs=1e-4)
    for record in records:
        (right if is_correct(record["response"], record["reference"]) else wrong).append(
            record["reward"]
        )
    assert right
    assert wrong
    assert sum(right) / len(right) > sum(wrong) / len(wrong) + 1.0
