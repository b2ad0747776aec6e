"""``lrft bench`` runs end to end on the tiny CPU workload and writes the documented JSON.

A smoke test of the benchmark, not a benchmark: nothing here is timed against a threshold.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lrft.bench.report import SCHEMA

PHASES = {"generate", "policy", "rewards", "advantages", "weight_sync", "sleep_wake"}


def _bench(
    args: list[str], tmp_path: Path, *, ranks: int = 1, workload: str = "tiny"
) -> dict[str, Any]:
    output = tmp_path / "bench.json"
    command = [
        *(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                f"--nproc_per_node={ranks}",
                f"--master_port={29300 + os.getpid() % 300}",
                "-m",
                "lrft",
            ]
            if ranks > 1
            else [sys.executable, "-m", "lrft"]
        ),
        "bench",
        *args,
        f"--workload={workload}",
        f"--output={output}",
        f"--work_dir={tmp_path / 'work'}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"written to {output}" in done.stdout
    document: dict[str, Any] = json.loads(output.read_text())
    return document


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def test_all_parts_on_the_tiny_workload(tmp_path: Path) -> None:
    doc = _bench(["all", "--steps=2"], tmp_path)
    assert doc["schema"] == SCHEMA
    assert doc["mode"] == "all"
    assert doc["workload"]["name"] == "tiny"
    env = doc["environment"]
    for key in ("lrft", "torch", "transformers", "python", "device_type", "device_name"):
        assert isinstance(env[key], str)
        assert env[key]
    assert env["world_size"] == 1
    assert env["git_commit"] is None or isinstance(env["git_commit"], str)
    assert _positive(doc["ceilings"]["matmul_tflops"])
    assert list(doc)[-4:] == ["grpo", "train_mfu", "sync", "sleep"]
    assert doc["parts_pending"] == []

    grpo = doc["grpo"]
    assert grpo["steps"] == 2
    assert grpo["steady_steps"] == [2]  # --steps clips the window
    assert len(grpo["step_seconds"]) == 2
    assert grpo["samples_per_step"] == 8
    assert set(grpo["phases_seconds_median"]) >= PHASES
    assert grpo["old_logprob_pass"] is False  # one epoch, one step, no reference model
    for key in (
        "step_seconds_median",
        "samples_per_s",
        "rollout_tokens_per_s",
        "train_tokens_per_s",
        "train_flops_per_step",
        "train_mfu",
        "generated_tokens_per_step",
    ):
        assert _positive(grpo[key]), key
    assert grpo["train_config"]["max_steps"] == 2

    train = doc["train_mfu"]
    assert len(train["step_seconds"]) == 2
    for key in ("step_seconds_median", "train_tokens_per_s", "train_flops_per_step", "train_mfu"):
        assert _positive(train[key]), key
    assert train["parameters"] == 107072

    sync = doc["sync"]
    assert sync["tensors"] == 26
    assert sync["bytes"] == 107072 * 4
    for name in ("verified", "unverified", "gather_only"):
        assert _positive(sync["seconds_median"][name])
        assert _positive(sync["GBps"][name])
        assert _positive(sync["fraction_of_device_copy"][name])
        assert _positive(sync["fraction_of_cast_copy"][name])
    assert _positive(sync["device_copy_GBps"])
    assert _positive(sync["cast_copy_seconds"])
    assert (sync["trainer_dtype"], sync["engine_dtype"]) == ("float32", "float32")
    assert sync["all_gather_bus_GBps"] is None  # one rank
    assert sync["fraction_of_all_gather"] is None

    sleep = doc["sleep"]
    assert sleep["bytes"] == 107072 * 4
    for level in ("level1", "level2"):
        assert _positive(sleep[level]["wake_seconds_median"])
        assert sleep[level]["freed_bytes"] == 0  # the CPU engine frees no device memory
    assert sleep["frees_memory"] is False
    assert sleep["host_to_device_pinned_GBps"] is None


@pytest.mark.parametrize("ranks", [2])
def test_sync_under_torchrun_measures_the_all_gather(tmp_path: Path, ranks: int) -> None:
    doc = _bench(["sync"], tmp_path, ranks=ranks)
    assert doc["environment"]["world_size"] == ranks
    assert _positive(doc["sync"]["all_gather_bus_GBps"])
    assert _positive(doc["sync"]["GBps"]["verified"])
