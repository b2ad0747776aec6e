"""``lrft bench``'s command line: every argument changes the settings and is read by the
benchmark, and bad input is refused before anything starts."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import attrs
import pytest

from lrft.bench import BenchSettings
from lrft.cli import build_parser, main
from lrft.cli.bench import build_bench_parser, settings_from_args

NON_DEFAULT = {
    "mode": ["sync"],
    "workload": ["--workload", "tiny"],
    "output": ["--output", "x.json"],
    "work_dir": ["--work_dir", "some/dir"],
    "steps": ["--steps", "2"],
}


def _arguments() -> list[str]:
    parser = build_bench_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[
        "bench"
    ]
    return [a.dest for a in sub._actions if a.dest != "help"]


def test_every_argument_changes_the_settings_and_is_read() -> None:
    names = {field.name for field in attrs.fields(BenchSettings)}
    assert set(_arguments()) == names == set(NON_DEFAULT)
    baseline = settings_from_args(["bench", "--workload", "w1", "grpo"])
    sources = "".join(
        path.read_text()
        for path in (Path(__file__).resolve().parents[3] / "src/lrft/bench").glob("*.py")
    )
    for name, argv in NON_DEFAULT.items():
        base = (
            ["bench", "--workload", "w1", "grpo"]
            if name != "mode"
            else ["bench", "--workload", "w1"]
        )
        changed = settings_from_args([*base, *argv])
        assert getattr(changed, name) != getattr(baseline, name), name
        assert re.search(rf"(self|settings)\.{name}\b", sources), name


def test_defaults_pick_a_workload_per_mode() -> None:
    assert settings_from_args(["bench", "grpo"]).workload_name == "w1"
    assert settings_from_args(["bench", "train-mfu"]).workload_name == "qwen2-1.5b"
    assert settings_from_args(["bench"]).workload_name == "tiny"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "grpo", "--workload", "qwen2-1.5b"], r"has no 'grpo' section"),
        (["bench", "--steps", "0"], r"steps must be a positive integer, got 0"),
        (["bench", "--workload", "missing.json"], r"'missing.json' is neither a built-in one"),
        (["bench", "grpo", "--workload", "BAD_TRAIN"], r"train_batch_size 48 must divide"),
        (["bench", "grpo", "--workload", "UNKNOWN_TRAIN"], r"grpo.train: .*'bogus'"),
    ],
)
def test_bad_settings_exit_2_naming_the_rule(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    tiny = json.loads(
        (Path(__file__).resolve().parents[3] / "src/lrft/bench/workloads/tiny.json").read_text()
    )
    for name, train in (("BAD_TRAIN", {"train_batch_size": 48}), ("UNKNOWN_TRAIN", {"bogus": 1})):
        workload = {**tiny, "grpo": {**tiny["grpo"], "train": {**tiny["grpo"]["train"], **train}}}
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(workload))
        argv = [str(path) if arg == name else arg for arg in argv]
    assert main(argv) == 2
    assert re.search(message, capsys.readouterr().err)


def test_lrft_help_lists_bench() -> None:
    assert "bench" in build_parser().format_help()
