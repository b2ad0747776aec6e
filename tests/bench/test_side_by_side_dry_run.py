"""The side-by-side runner (``scripts/bench_w1_gpu.sh``) dry-runs on the CPU: its stages, on the
tiny stand-ins of the measured workloads, run both sides' scripts (``lrft bench``,
``scripts/trl_grpo.py`` on both of TRL's generation paths, ``scripts/trl_vl1.py``) and the pair
tool, so that a GPU call finds no surprise in them; a stage out of time is reported and fails
the run. A check of the scripts, not a measurement."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "scripts" / "bench_w1_gpu.sh"


def _runner(tmp_path: Path, **settings: str) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec("trl") is None:
        pytest.fail("TRL is not installed: pip install -e '.[test]' installs it")
    env = {
        **os.environ,
        "BENCH_TINY": "1",
        "OUT": str(tmp_path / "out"),
        "WORK_DIR": str(tmp_path / "work"),
        "PYTHON": os.environ.get("PYTHON", "python"),
        "OMP_NUM_THREADS": "1",
        **settings,
    }
    return subprocess.run(
        ["bash", str(SCRIPT), "run"], capture_output=True, text=True, timeout=600, env=env
    )


def _read(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def _check_lrft_ragged(grpo: dict[str, Any]) -> None:
    """``tiny-ragged`` on lrft's side (the static loop, 4 rows for 8 responses): every response
    ends at an EOS the engine sampled (at the law's cap of 8 too), and the figures are there."""
    from lrft.bench.ragged import expected_length
    from lrft.bench.workloads import RaggedSpec

    ragged = grpo["ragged"]
    spec = RaggedSpec(min_tokens=2, max_tokens=8, seed=1)
    assert ragged["expected_tokens_mean"] == expected_length(spec)
    assert ragged["ended_at_stop_share"] == 1.0
    assert grpo["engine"] == {"name": "hf", "decode_path": "static"}
    for generated in ragged["generated_tokens_per_step"]:  # steps 2 and 3
        assert 2 * 8 <= generated <= 8 * 8
    assert 2 <= ragged["response_tokens_max"] <= 8
    for key in ("rollout_tokens_per_s", "full_batch_tokens_per_s", "ideal_generate_seconds"):
        assert ragged[key] > 0, key
    assert ragged["generate_over_ideal"] > 0


def test_every_side_dry_runs_on_the_tiny_workloads(tmp_path: Path) -> None:
    stages = "lrft_w2_ragged trl_w2_ragged trl_w2_ragged_cb lrft_vl1 trl_vl1"
    done = _runner(tmp_path, STAGES=stages)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = tmp_path / "out"
    assert not (out / "failures.txt").exists()
    for name in ("lrft_w2_ragged", "lrft_vl1"):
        assert _read(out / f"{name}.json")["parts_pending"] == []
    _check_lrft_ragged(_read(out / "lrft_w2_ragged.json")["grpo"])
    for name, generation in (
        ("trl_w2_ragged", "generate"),
        ("trl_w2_ragged_cb", "continuous_batching"),
        ("trl_vl1", "generate"),
    ):
        document = _read(out / f"{name}.json")
        assert document["complete"] is True
        assert document["configuration"]["generation"] == generation
        assert document["steady_steps"] == [2, 3]
        assert document["call"] == _read(out / "lrft_vl1.json")["environment"]["call"]
        rows = document["samples_per_step"]
        for tokens in document["generated_tokens_per_step"]:
            # tiny-ragged's responses end at 2 to 8 tokens, vl-tiny's run to their 8
            assert (2 * rows <= tokens <= 8 * rows) if "ragged" in name else tokens == 8 * rows
    ratios = (out / "ratios.txt").read_text().splitlines()
    assert len(ratios) == 3, ratios
    assert all("same call" in line and "x (" in line for line in ratios), ratios
    ratio = _read(out / "ratio_lrft_w2_ragged_vs_trl_w2_ragged_cb.json")
    assert ratio["trl"]["label"].startswith("TRL GRPOTrainer, continuous batching")


def test_a_stage_out_of_time_fails_the_run_visibly(tmp_path: Path) -> None:
    # a budget of 30 s starts the first stage (at least 30 s left), whose own limit is 1 s, and
    # leaves too little for the second
    done = _runner(tmp_path, STAGES="trl_w2 trl_vl1", LIMIT_trl_w2="1", CALL_BUDGET="30")
    assert done.returncode == 1
    assert "STAGE trl_w2 TIMED OUT after 1s (limit 1s)" in done.stderr
    assert "STAGE trl_vl1 SKIPPED" in done.stderr
    assert "stage(s) did not complete" in done.stderr


def test_the_decode_profile_dry_runs_with_ragged_ends(tmp_path: Path) -> None:
    """``scripts/profile_decode.py --ragged`` (the decode loop's profile, on lrft's side) on the
    tiny workload on the CPU: its ragged rollouts end through the same hook and are timed."""
    output = tmp_path / "profile.json"
    command = [
        os.environ.get("PYTHON", "python"), str(ROOT / "scripts" / "profile_decode.py"),
        "--device", "cpu", "--workload", "tiny", "--decode", "static", "--ragged",
        "--repeats", "1", "--profile_tokens", "0", "--queue", "2", "--out", str(output),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    ragged = _read(output)["ragged"]
    assert [figure["sequences"] for figure in ragged] == [8, 16]  # 8 rows, queues of 1 and 2
    for figure in ragged:
        assert figure["tokens"] == 8 * figure["sequences"]  # tiny's law: 8 tokens, its cap
        assert figure["seconds"] > 0
