"""Metrics: one JSON object per line, always; TensorBoard, W&B and a curve PNG when asked.

TensorBoard and matplotlib (``pip install 'lrft[plots]'``) and wandb (``pip install
'lrft[wandb]'``, :mod:`lrft.run.wandb_metrics`) are optional: they are imported only when
used, so the trainer runs without them.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lrft.extras import PLOTS_EXTRA, matplotlib_available, tensorboard_available

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

    from lrft.run.wandb_metrics import WandbMetrics

"""How to install the optional plotting and TensorBoard dependencies; named in errors."""

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
CURVES_FILE = "curves.png"
"""The names of the metrics outputs under ``SAVE_PATH``."""


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

    def truncate_after(self, step: int) -> None:
        """Drop the lines of steps after ``step``, keeping the others byte for byte.

        A run resumed from its checkpoint at ``step`` logs the later steps again; without this
        the file would hold them twice. The file is replaced in one rename, so a crash leaves
        either the old or the new file. A line that does not parse is the torn last write of a
        killed run, and goes too.
        """
        if not self.enabled or not self.path.exists():
            return
        lines = self.path.read_bytes().splitlines(keepends=True)
        kept = [line for line in lines if _at_or_before(line, step)]
        temporary = self.path.with_name(self.path.name + ".tmp")
        with temporary.open("wb") as file:
            file.writelines(kept)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, self.path)


def _at_or_before(line: bytes, step: int) -> bool:
    try:
        record = json.loads(line)
    except ValueError:
        return False
    logged = record.get("step") if isinstance(record, dict) else None
    return isinstance(logged, int) and logged <= step


class TensorBoardMetrics:
    """Each metric as a TensorBoard scalar tagged with its own name, at the step.

    The event file is opened at the first :meth:`log` with ``purge_step`` set to that step: a run
    resumed from a checkpoint at step k first logs step k + 1, so TensorBoard drops what the
    interrupted run wrote after its checkpoint instead of showing two points per step.
    """

    def __init__(self, log_dir: Path) -> None:
        if not tensorboard_available():
            raise ImportError(f"TensorBoard logging needs the tensorboard package: {PLOTS_EXTRA}")
        self.log_dir = log_dir
        self._writer: SummaryWriter | None = None

    def log(self, step: int, kind: str, values: Mapping[str, float]) -> None:
        del kind  # the metric names already carry it (train/..., eval/...)
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=step)
        for name, value in values.items():
            self._writer.add_scalar(name, value, global_step=step)
        # Flushed per record, like the JSONL file, so a killed run keeps its curves.
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class MetricsWriter:
    """What the trainer logs, on rank 0: ``metrics.jsonl`` always, TensorBoard and W&B when asked.

    ``save_path/metrics.jsonl``, ``save_path/tensorboard/`` and the W&B run (``wandb``) get the
    same records. Ranks other than 0 (``enabled=False``) write nothing.
    """

    def __init__(
        self,
        save_path: Path,
        *,
        enabled: bool,
        tensorboard: bool,
        wandb: WandbMetrics | None = None,
    ) -> None:
        self.jsonl = JsonlMetrics(save_path / METRICS_FILE, enabled=enabled)
        self.tensorboard = (
            TensorBoardMetrics(save_path / TENSORBOARD_DIR) if enabled and tensorboard else None
        )
        self.wandb = wandb if enabled else None

    @property
    def path(self) -> Path:
        """The JSONL file."""
        return self.jsonl.path

    def resume_at(self, step: int) -> None:
        """A run resumed from its checkpoint at ``step``: drop the JSONL lines of later steps
        (TensorBoard purges its own at the first :meth:`log`)."""
        self.jsonl.truncate_after(step)

    def log(self, step: int, kind: str, values: Mapping[str, float]) -> None:
        self.jsonl.log(step, kind, values)
        if self.tensorboard is not None:
            self.tensorboard.log(step, kind, values)
        if self.wandb is not None:
            self.wandb.log(step, kind, values)

    def close(self, *, failed: bool = False) -> None:
        """End the TensorBoard event file and the W&B run (marked failed when ``failed``)."""
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.close(failed=failed)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def plot_curves(metrics_path: Path, output: Path) -> bool:
    """Training reward and held-out accuracy against the step; ``False`` without matplotlib.

    The figure is 600 x 400 pixels.
    """
    if not matplotlib_available():
        return False
    import matplotlib  # type: ignore[import-not-found, unused-ignore]  # optional (lrft[plots]), untyped

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]  # optional (lrft[plots]), untyped

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
