"""``torchrun --nproc_per_node 2 -m lrft train`` end to end, on gloo: resume after SIGKILL is
bit-exact, a failing rank stops every rank, the Hugging Face export loads, a save path holds one
run."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from transformers import AutoModelForCausalLM

from lrft.run.checkpoint import read_manifest
from tests.trainer.fixtures import REWARD_FLAG, base_args, make_model_folder, make_prompt_files

ROOT = Path(__file__).resolve().parents[2]


def _command(args: list[str]) -> list[str]:
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    return [*torchrun, "--master_port", str(29600 + os.getpid() % 300), "-m", "lrft", *args]


def _env(**extra: str) -> dict[str, str]:
    # This tree's lrft, whatever an installed copy is: the workers import what is tested here.
    paths = [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, paths)), OMP_NUM_THREADS="1")
    env.update(extra)
    return env


def _run(args: list[str], **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _command(args), env=_env(**extra), capture_output=True, text=True, timeout=300, check=False
    )


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("trainer_inputs")
    train, held_out = make_prompt_files(root / "data")
    return make_model_folder(root / "model"), train, held_out


def _weights(save: Path) -> dict[str, torch.Tensor]:
    return load_file(save / "hf_model" / "model.safetensors")


def _descendants(pid: int) -> list[int]:
    """Every live process below ``pid``, read from /proc (torchrun starts each worker in a
    session of its own, so killing torchrun's process group does not reach them)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the process ended while we looked
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, frontier = [], [pid]
    while frontier:
        below = children.get(frontier.pop(), [])
        found.extend(below)
        frontier.extend(below)
    return found


def _kill_job(pid: int) -> None:
    """SIGKILL the launcher and every worker at once, as a node failure would."""
    for victim in [pid, *_descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)


def output_of_stopped_job(command: list[str], env: dict[str, str]) -> tuple[int | None, str]:
    """The exit code and the stdout and stderr of a job that one of its ranks stops (SIGSTOP),
    once it failed; every process of it is then killed (SIGKILL reaches a stopped rank; SIGTERM
    would wait for SIGCONT)."""
    process = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=240)
        code = process.returncode
    finally:
        _kill_job(process.pid)
        process.wait(timeout=60)
    return code, stdout + stderr


def test_sigkill_after_checkpoint_then_resume_is_bit_identical(
    inputs: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    model, train, held_out = inputs
    steps = ["--max_steps=4", "--save_steps=2", "--enable_engine_sleep", "--init_kl_coef=0.01"]
    straight = tmp_path / "straight"
    done = _run([*base_args(model, train, held_out, straight), *steps])
    assert done.returncode == 0, done.stderr[-3000:]

    killed = tmp_path / "killed"
    args = [*base_args(model, train, held_out, killed), *steps]
    args[args.index(REWARD_FLAG)] = "--reward_fn=tests.trainer.fixtures:exact_then_hang"
    marker = killed / "checkpoints" / "global_step2" / "manifest.json"
    process = subprocess.Popen(
        _command(args),
        env=_env(LRFT_TEST_HANG_WHEN=str(marker)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker.exists(), "the run never wrote checkpoint global_step2"
        time.sleep(1.0)  # now hanging inside step 3's reward
    finally:
        _kill_job(process.pid)
        process.wait(timeout=60)
    assert not (killed / "hf_model").exists()
    assert not (killed / "checkpoints" / "global_step4").exists()

    # The same command (a resume may not change the reward); without the marker it never hangs.
    resumed = _run([*args, "--load_checkpoint"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "at step 2" in resumed.stdout

    expected, actual = _weights(straight), _weights(killed)
    assert expected.keys() == actual.keys()
    initial = load_file(model / "model.safetensors")
    assert any(not torch.equal(expected[k], initial[k]) for k in expected), "training did nothing"
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name

    exported = AutoModelForCausalLM.from_pretrained(straight / "hf_model")
    for name, tensor in exported.state_dict().items():
        if name in expected:
            assert torch.equal(tensor, expected[name]), name


def test_a_rank_that_raises_stops_every_rank_and_is_named(
    inputs: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    model, train, held_out = inputs
    args = base_args(model, train, held_out, tmp_path / "out")
    args[args.index(REWARD_FLAG)] = "--reward_fn=tests.trainer.fixtures:exact_but_rank1_raises"
    timeout = 60.0
    start = time.monotonic()
    result = _run([*args, "--max_steps=2", f"--collective_timeout_s={timeout}"])
    elapsed = time.monotonic() - start
    assert result.returncode != 0
    assert elapsed < timeout + 45, elapsed
    output = result.stdout + result.stderr
    assert "lrft: rank 1 failed: RewardError" in output
    assert "at sample 0" in output
    assert "deliberate failure on rank 1" in output
    # rank 0 was waiting in a collective: it fails too (peer gone, or stopped by torchrun)
    # instead of hanging until the timeout.


def _train_rows(save: Path) -> list[dict[str, float]]:
    lines = (save / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if row["kind"] == "train"]


def _critic_state(save: Path, step: int, scratch: Path) -> dict[str, Any]:
    """The critic's weights and AdamW state in checkpoint ``step``, read from its DCP files."""
    scratch.parent.mkdir(parents=True, exist_ok=True)
    dcp_to_torch_save(save / "checkpoints" / f"global_step{step}" / "critic", scratch)
    state: dict[str, Any] = torch.load(scratch, weights_only=False)
    return state


def _flat(tree: object, prefix: str = "") -> dict[str, object]:
    if isinstance(tree, dict):
        flat: dict[str, object] = {}
        for key, value in tree.items():
            flat.update(_flat(value, f"{prefix}{key}."))
        return flat
    return {prefix: tree}


def test_ppo_with_a_critic_logs_value_losses_and_resumes_bit_identically(
    inputs: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    model, train, held_out = inputs
    ppo = [
        "--advantage_estimator=gae",
        "--critic_learning_rate=1e-3",
        "--value_clip=0.1",
        "--lambd=0.9",
        "--enable_engine_sleep",
        "--init_kl_coef=0.01",
        "--save_steps=2",
    ]
    straight = tmp_path / "straight"
    done = _run([*base_args(model, train, held_out, straight), *ppo, "--max_steps=4"])
    assert done.returncode == 0, done.stderr[-3000:]
    rows = _train_rows(straight)
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    for row in rows:
        for name in ("critic/value_loss", "critic/grad_norm", "time/critic_values_s"):
            assert math.isfinite(row[name]), (name, row)
        assert row["critic/lr"] == 1e-3

    # a run resumed from the step-2 checkpoint (what a run stopped after it would have left)
    split = tmp_path / "split"
    shutil.copytree(
        straight / "checkpoints" / "global_step2", split / "checkpoints" / "global_step2"
    )
    resumed = _run(
        [*base_args(model, train, held_out, split), *ppo, "--max_steps=4", "--load_checkpoint"]
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "at step 2" in resumed.stdout

    expected, actual = _weights(straight), _weights(split)
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name
    critic_expected = _flat(_critic_state(straight, 4, tmp_path / "dcp" / "straight.pt"))
    critic_actual = _flat(_critic_state(split, 4, tmp_path / "dcp" / "split.pt"))
    assert critic_expected.keys() == critic_actual.keys()
    assert any(".exp_avg_sq" in key for key in critic_expected), sorted(critic_expected)[:5]
    for key, value in critic_expected.items():
        other = critic_actual[key]
        if isinstance(value, torch.Tensor):
            assert isinstance(other, torch.Tensor)
            assert torch.equal(value, other), key
        else:
            assert value == other, key
    initial = load_file(model / "model.safetensors")
    moved = critic_expected["model.model.norm.weight."]
    assert isinstance(moved, torch.Tensor)
    assert not torch.equal(moved, initial["model.norm.weight"]), "the critic did not train"
    # the export is the actor alone: no value head in it
    assert not [name for name in expected if name.startswith("score.")]
    assert set(expected) <= set(initial)


def _snapshot(save: Path) -> dict[str, bytes]:
    return {str(p.relative_to(save)): p.read_bytes() for p in save.rglob("*") if p.is_file()}


def test_a_save_path_holds_one_run_and_a_resume_must_match_it(
    inputs: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """Rerunning a command into its own output folder is refused and changes nothing; a resume
    with another temperature and seed is refused, naming both; a resume that only runs longer continues the same run, each
    step logged once."""
    model, train, held_out = inputs
    save = tmp_path / "out"
    args = [*base_args(model, train, held_out, save), "--save_steps=1", "--max_ckpt_num=2"]
    if importlib.util.find_spec("tensorboard") is not None:
        args.append("--use_tensorboard")
    first = _run([*args, "--max_steps=2"])
    assert first.returncode == 0, first.stderr[-3000:]
    run_id = json.loads((save / "run.json").read_text())["run_id"]
    before = _snapshot(save)

    again = _run([*args, "--max_steps=2"])
    # torchrun exits 1 when a worker fails; the worker says why (and exits 2)
    assert again.returncode != 0
    assert "lrft: rank 0: configuration error: save_path" in again.stderr
    assert "already holds the outputs of another run: run.json, metrics.jsonl" in again.stderr
    for way_out in ("--load_checkpoint", "fresh --save_path", "--overwrite_output"):
        assert way_out in again.stderr
    changed = ["--temperature=0.5", "--seed=7"]
    other = _run([*args, "--max_steps=3", *changed, "--load_checkpoint"])
    assert other.returncode != 0
    assert "global_step2 was written with other settings" in other.stderr
    assert "temperature 1.0 -> 0.5; seed 42 -> 7" in other.stderr
    assert _snapshot(save) == before

    resumed = _run([*args, "--max_steps=3", "--load_checkpoint"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming with changed settings: max_steps 2 -> 3" in resumed.stdout
    assert "at step 2" in resumed.stdout
    first_lines = before["metrics.jsonl"].splitlines(keepends=True)
    lines = (save / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    assert lines[: len(first_lines)] == first_lines
    logged = [(row["step"], row["kind"]) for row in map(json.loads, lines)]
    # the first run's last step was evaluated (it ended there); the resumed one goes on
    assert logged == [
        (0, "eval"),
        (1, "train"),
        (2, "train"),
        (2, "eval"),
        (3, "train"),
        (3, "eval"),
    ]
    assert json.loads((save / "run.json").read_text())["run_id"] == run_id
    checkpoints = sorted(p.name for p in (save / "checkpoints").iterdir())
    assert checkpoints == ["global_step2", "global_step3"]
    for name in checkpoints:
        assert read_manifest(save / "checkpoints" / name)["run_id"] == run_id
