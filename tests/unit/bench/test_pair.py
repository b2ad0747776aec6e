"""``python -m lrft.bench.pair``: a labelled ratio from two complete documents of one workload
and one step window, and a refusal for anything less."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from lrft.bench.pair import main


def _lrft(**changes: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "workload": {"name": "w2"},
        "environment": {"lrft": "0.1.0", "device_type": "cuda", "call": "c1"},
        "parts_pending": [],
        "grpo": {
            "train_config": {"engine_type": "hf", "fsdp_reshard_after_forward": True},
            "engine": {"name": "hf", "decode_path": "cuda_graph"},
            "steady_steps": [2, 3, 4],
            "step_seconds_median": 8.0,
            "samples_per_s": 16.0,
            "phases_seconds_median": {"generate": 5.0},
        },
    }
    document.update(changes)
    return document


def _trl(**changes: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "workload": "w2",
        "complete": True,
        "trl": "1.16.0",
        "call": "c1",
        "configuration": {"label": "TRL GRPOTrainer, continuous batching, pure bf16"},
        "steady_steps": [2, 3, 4],
        "step_seconds_median": 32.0,
        "samples_per_s": 4.0,
        "callback_step_seconds_median": 30.0,
        "phases_seconds_median": {"generate": 20.0},
    }
    document.update(changes)
    return document


def _run(tmp_path: Path, lrft: dict[str, Any] | None, trl: dict[str, Any] | None) -> int:
    paths = []
    for name, document in (("lrft", lrft), ("trl", trl)):
        path = tmp_path / f"{name}.json"
        if document is not None:
            path.write_text(json.dumps(document))
        paths.append(path)
    return main(
        ["--lrft", str(paths[0]), "--trl", str(paths[1]), "--output", str(tmp_path / "r.json")]
    )


def test_a_complete_pair_gives_a_labelled_ratio(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(tmp_path, _lrft(), _trl()) == 0
    line = capsys.readouterr().out
    assert "4.00x" in line  # 16 / 4 samples/s
    assert "3.75x against the callback window" in line  # 30 / 8 s
    assert "same call c1" in line
    assert "FSDP2 re-gathering after forward, fp32 master weights, bf16 compute" in line
    assert "continuous batching, pure bf16 (TRL 1.16.0)" in line
    written = json.loads((tmp_path / "r.json").read_text())
    assert written["ratio_samples_per_s"] == 4.0
    assert written["same_call"] is True


def test_two_calls_are_said_to_be_indicative(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(tmp_path, _lrft(), _trl(call="c2")) == 0
    assert "NOT the same call (c1 / c2): indicative only" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("lrft", "trl", "reason"),
    [
        (None, _trl(), "lrft side's document .* is missing"),
        (_lrft(), None, "TRL side's document .* is missing"),
        (_lrft(parts_pending=["grpo"]), _trl(), "incomplete: parts \\['grpo'\\]"),
        (_lrft(), _trl(complete=False, steps=2), "incomplete: 2 steps"),
        (_lrft(), _trl(workload="w1"), "workloads differ"),
        (_lrft(), _trl(steady_steps=[2, 3]), "step windows differ"),
    ],
)
def test_half_a_pair_gets_no_ratio(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    lrft: dict[str, Any] | None,
    trl: dict[str, Any] | None,
    reason: str,
) -> None:
    assert _run(tmp_path, lrft, trl) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert not (tmp_path / "r.json").exists()
    assert re.search(f"no ratio: .*{reason}", captured.err), captured.err


def test_an_empty_document_gets_no_ratio(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "lrft.json").write_text("")
    (tmp_path / "trl.json").write_text(json.dumps(_trl()))
    code = main(["--lrft", str(tmp_path / "lrft.json"), "--trl", str(tmp_path / "trl.json")])
    assert code == 1
    assert "missing or empty" in capsys.readouterr().err
