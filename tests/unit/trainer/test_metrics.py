"""Metrics outputs read back by independent readers: TensorBoard's own, PIL for the PNG."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import pytest

from lrft.run.metrics import (
    TRAIN_CURVES,
    Curve,
    CurvesPlot,
    MetricsWriter,
    curves_figure,
    plot_curves,
    read_metrics,
)

RECORDS: list[tuple[int, str, dict[str, float]]] = [
    (0, "eval", {"eval/accuracy": 0.125, "eval/reward_mean": 0.125}),
    (1, "train", {"train/reward_mean": 0.25, "time/step_s": 1.7, "memory/policy_mb": 812.3}),
    (2, "train", {"train/reward_mean": 0.5, "time/step_s": 1.6, "memory/policy_mb": 813.9}),
    (2, "eval", {"eval/accuracy": 0.375, "eval/reward_mean": 0.375}),
]


def _float32(value: float) -> float:
    # TensorBoard stores scalars as float32.
    return float(struct.unpack("f", struct.pack("f", value))[0])


def _read_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    accumulator_module = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator",
        reason="needs tensorboard (pip install 'lrft[plots]')",
    )
    accumulator = accumulator_module.EventAccumulator(str(log_dir))
    accumulator.Reload()
    return {
        tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()["scalars"]
    }


def _expected(
    records: list[tuple[int, str, dict[str, float]]],
) -> dict[str, list[tuple[int, float]]]:
    expected: dict[str, list[tuple[int, float]]] = {}
    for step, _, values in records:
        for name, value in values.items():
            expected.setdefault(name, []).append((step, _float32(value)))
    return expected


def test_tensorboard_gets_every_metric_the_jsonl_gets(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="needs tensorboard (pip install 'lrft[plots]')")
    writer = MetricsWriter(tmp_path, enabled=True, tensorboard=True)
    for step, kind, values in RECORDS:
        writer.log(step, kind, values)
    writer.close()

    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert _read_scalars(tmp_path / "tensorboard") == _expected(RECORDS)
    jsonl = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["kind"]) for r in jsonl] == [(s, k) for s, k, _ in RECORDS]


def test_resumed_run_replaces_the_steps_after_its_checkpoint(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="needs tensorboard (pip install 'lrft[plots]')")
    interrupted = MetricsWriter(tmp_path, enabled=True, tensorboard=True)
    for step in (1, 2, 3):  # checkpoint at step 2, killed after logging step 3
        interrupted.log(step, "train", {"train/reward_mean": step / 10})
    interrupted.close()
    resumed = MetricsWriter(tmp_path, enabled=True, tensorboard=True)
    for step in (3, 4):
        resumed.log(step, "train", {"train/reward_mean": step / 100})
    resumed.close()

    scalars = _read_scalars(tmp_path / "tensorboard")["train/reward_mean"]
    assert scalars == [
        (1, _float32(0.1)),
        (2, _float32(0.2)),
        (3, _float32(0.03)),
        (4, _float32(0.04)),
    ]


def test_resume_drops_the_jsonl_lines_after_the_checkpoint_and_keeps_the_rest(
    tmp_path: Path,
) -> None:
    interrupted = MetricsWriter(tmp_path, enabled=True, tensorboard=False)
    for step in (1, 2, 3, 4):
        interrupted.log(step, "train", {"train/reward_mean": step / 10})
    interrupted.log(2, "eval", {"eval/accuracy": 0.5})  # an eval at the checkpoint's step
    lines = (tmp_path / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    with (tmp_path / "metrics.jsonl").open("ab") as file:
        file.write(b'{"kind": "train", "st')  # the torn last write of a killed run

    MetricsWriter(tmp_path, enabled=False, tensorboard=False).resume_at(2)  # rank 1: no-op
    assert (tmp_path / "metrics.jsonl").read_bytes().endswith(b'"st')
    resumed = MetricsWriter(tmp_path, enabled=True, tensorboard=False)
    resumed.resume_at(2)

    assert (tmp_path / "metrics.jsonl").read_bytes() == b"".join([lines[0], lines[1], lines[4]])
    assert not list(tmp_path.glob("*.tmp"))
    resumed.log(3, "train", {"train/reward_mean": 0.03})
    steps = [(r["step"], r["kind"]) for r in read_metrics(resumed.path)]
    assert steps == [(1, "train"), (2, "train"), (2, "eval"), (3, "train")]


def test_other_ranks_and_the_default_write_no_tensorboard(tmp_path: Path) -> None:
    MetricsWriter(tmp_path / "rank1", enabled=False, tensorboard=True).log(1, "train", {"a": 1.0})
    without = MetricsWriter(tmp_path / "rank0", enabled=True, tensorboard=False)
    without.log(1, "train", {"a": 1.0})
    without.close()
    assert not (tmp_path / "rank1").exists()
    assert without.tensorboard is None
    assert not (tmp_path / "rank0" / "tensorboard").exists()


def test_non_finite_values_are_null_in_jsonl(tmp_path: Path) -> None:
    writer = MetricsWriter(tmp_path, enabled=True, tensorboard=False)
    writer.log(1, "train", {"train/reward_mean": math.nan})
    assert read_metrics(writer.path) == [{"kind": "train", "step": 1, "train/reward_mean": None}]


def test_plot_curves_writes_a_readable_png(tmp_path: Path) -> None:
    image_module = pytest.importorskip(
        "PIL.Image", reason="needs pillow (pip install 'lrft[plots]')"
    )
    pytest.importorskip("matplotlib", reason="needs matplotlib (pip install 'lrft[plots]')")
    writer = MetricsWriter(tmp_path, enabled=True, tensorboard=False)
    for step, kind, values in RECORDS:
        writer.log(step, kind, values)
    png = tmp_path / "curves.png"

    assert plot_curves(writer.path, png)

    assert png.stat().st_size > 0
    with image_module.open(png) as image:
        assert image.format == "PNG"
        assert image.size == (600, 400)  # figsize 6 x 4 inches at 100 dpi
        image.load()


def test_the_curves_have_their_points_a_y_axis_label_and_a_title() -> None:
    pytest.importorskip("matplotlib", reason="needs matplotlib (pip install 'lrft[plots]')")
    records = [{"step": s, "kind": k, **v} for s, k, v in RECORDS]
    axis = curves_figure(records, TRAIN_CURVES).axes[0]
    assert axis.get_xlabel() == "step"
    assert axis.get_ylabel() == "reward / accuracy"
    assert axis.get_title() == "lrft train: training reward and held-out accuracy"
    lines = {line.get_label(): line.get_xydata().tolist() for line in axis.lines}
    assert lines == {
        "train reward (mean)": [[1.0, 0.25], [2.0, 0.5]],
        "held-out accuracy (greedy)": [[0.0, 0.125], [2.0, 0.375]],
    }
    # another command's plot: its own lines, label and title; a missing value is no point
    plot = CurvesPlot(
        curves=(Curve(kind="train", name="train/accuracy", label="pairs"),),
        ylabel="pair accuracy",
        title="rm",
    )
    rm_records = [
        {"step": 1, "kind": "train", "train/accuracy": 0.5},
        {"step": 2, "kind": "train", "train/accuracy": None},
        {"step": 3, "kind": "train", "train/accuracy": 0.75},
    ]
    axis = curves_figure(rm_records, plot).axes[0]
    assert (axis.get_ylabel(), axis.get_title()) == ("pair accuracy", "rm")
    assert [line.get_xydata().tolist() for line in axis.lines] == [[[1.0, 0.5], [3.0, 0.75]]]
