"""Metrics: one JSON object per line, always; a reward/accuracy curve when matplotlib exists."""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class JsonlMetrics:
    """Appends ``{"step": k, "kind": ..., name: value, ...}`` lines to ``path`` (rank 0 only)."""

    def __init__(self, path: Path, *, enabled: bool) -> None:
        self.path = path
        self.enabled = enabled
        if enabled:
            path.parent.mkdir(parents=True, exist_ok=True)

    def log(self, step: int, kind: str, values: Mapping[str, float]) -> None:
        if not self.enabled:
            return
        record: dict[str, Any] = {"step": step, "kind": kind}
        record.update({k: (v if math.isfinite(v) else None) for k, v in values.items()})
        with self.path.open("a", encoding="utf-8") as file:
            file.write(json.dumps(record, sort_keys=True) + "\n")
            file.flush()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def matplotlib_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def plot_curves(metrics_path: Path, output: Path) -> bool:
    """Training reward and held-out accuracy against the step; ``False`` without matplotlib."""
    if not matplotlib_available():
        return False
    import matplotlib  # type: ignore[import-not-found, unused-ignore]

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]

    records = read_metrics(metrics_path)
    train = [(r["step"], r["train/reward_mean"]) for r in records if r["kind"] == "train"]
    evals = [(r["step"], r["eval/accuracy"]) for r in records if r["kind"] == "eval"]
    figure, axis = plt.subplots(figsize=(6, 4))
    if train:
        axis.plot(*zip(*train, strict=True), label="train reward (mean)")
    if evals:
        axis.plot(*zip(*evals, strict=True), marker="o", label="held-out accuracy (greedy)")
    axis.set_xlabel("step")
    axis.legend()
    figure.savefig(output, dpi=100)
    plt.close(figure)
    return True
