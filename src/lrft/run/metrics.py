"""Metrics: one JSON object per line, always; TensorBoard, W&B and a curve PNG when asked.

TensorBoard and matplotlib (``pip install 'lrft[plots]'``) and wandb (``pip install
'lrft[wandb]'``, :mod:`lrft.run.wandb_metrics`) are optional: they are imported only when
used, so the trainer runs without them.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

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


@attrs.frozen(kw_only=True)
class Curve:
    """One line of the curves PNG: metric ``name`` of the records of ``kind``."""

    kind: str
    name: str
    label: str


@attrs.frozen(kw_only=True)
class CurvesPlot:
    """What the curves PNG shows: its lines, the y axis's label and the title."""

    curves: tuple[Curve, ...]
    ylabel: str
    title: str


TRAIN_CURVES = CurvesPlot(
    curves=(
        Curve(kind="train", name="train/reward_mean", label="train reward (mean)"),
        Curve(kind="eval", name="eval/accuracy", label="held-out accuracy (greedy)"),
    ),
    ylabel="reward / accuracy",
    title="lrft train: training reward and held-out accuracy",
)
"""``lrft train``'s curves."""


def curves_figure(records: Sequence[Mapping[str, Any]], plot: CurvesPlot) -> Any:
    """A 6 x 4 inch matplotlib figure of ``plot``'s lines against the step (a record that lacks
    a line's metric, or holds ``None`` for it, is not a point of that line). Needs matplotlib."""
    import matplotlib  # type: ignore[import-not-found, unused-ignore]  # optional (lrft[plots]), untyped

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]  # optional (lrft[plots]), untyped

    figure, axis = plt.subplots(figsize=(6, 4))
    for curve in plot.curves:
        points = [
            (r["step"], r[curve.name])
            for r in records
            if r["kind"] == curve.kind and r.get(curve.name) is not None
        ]
        if points:
            steps, values = zip(*points, strict=True)
            axis.plot(
                steps, values, marker="o" if curve.kind == "eval" else None, label=curve.label
            )
    axis.set_xlabel("step")
    axis.set_ylabel(plot.ylabel)
    axis.set_title(plot.title)
    if axis.lines:
        axis.legend()
    return figure


def plot_curves(metrics_path: Path, output: Path, plot: CurvesPlot = TRAIN_CURVES) -> bool:
    """``plot`` of the records in ``metrics_path`` as a PNG at ``output``; ``False`` without
    matplotlib. The figure is 600 x 400 pixels."""
    if not matplotlib_available():
        return False
    import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]  # optional (lrft[plots]), untyped

    figure = curves_figure(read_metrics(metrics_path), plot)
    figure.savefig(output, dpi=100)
    plt.close(figure)
    return True


def report_outputs(
    metrics: MetricsWriter, save_path: Path, plot: CurvesPlot, say: Callable[[str], None]
) -> None:
    """At the end of a run, on rank 0: write the curves PNG and name it and the TensorBoard
    logs (``say`` prints a line)."""
    if metrics.jsonl.enabled and metrics.path.exists():
        png = save_path / CURVES_FILE
        if plot_curves(metrics.path, png, plot):
            say(f"curves written to {png}")
        else:
            say(f"matplotlib is not installed: no curve PNG (metrics are in JSONL; {PLOTS_EXTRA})")
    if metrics.tensorboard is not None:
        say(f"TensorBoard logs in {metrics.tensorboard.log_dir}")
