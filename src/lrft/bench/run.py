"""``lrft bench``: run one part of a workload (or all of them) and write the JSON document."""

from __future__ import annotations

import gc
import tempfile
from pathlib import Path
from typing import Any

import attrs
import torch

from lrft.api.errors import ConfigError
from lrft.bench.ceilings import compute_dtype, matmul_tflops
from lrft.bench.report import SCHEMA, environment, table, write_json
from lrft.bench.workloads import Workload, load_workload

MODES = ("grpo", "train-mfu", "sync", "sleep", "all")
"""``lrft bench MODE``: one part, or every part the workload defines (``all``)."""

DEFAULT_WORKLOADS = {
    "grpo": "w1",
    "train-mfu": "qwen2-1.5b",
    "sync": "w1",
    "sleep": "w1",
    "all": "tiny",
}
"""The workload each mode runs when ``--workload`` is not given."""


def _optional_path(value: str | Path | None) -> Path | None:
    return None if value is None else Path(value)


@attrs.frozen(kw_only=True)
class BenchSettings:
    """What ``lrft bench`` was asked for (one field per command-line argument).

    ``steps`` replaces the workload's step count of the GRPO part and the timed steps of the
    training part (a quicker run; the steady window is clipped to it).
    """

    mode: str = attrs.field(default="all")
    workload: str | None = None
    output: Path | None = attrs.field(default=None, converter=_optional_path)
    work_dir: Path | None = attrs.field(default=None, converter=_optional_path)
    steps: int | None = None

    def __attrs_post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"mode {self.mode!r} is unknown; choose one of {', '.join(MODES)}")
        if self.steps is not None and (isinstance(self.steps, bool) or self.steps < 1):
            raise ConfigError(f"steps must be a positive integer, got {self.steps!r}")

    @property
    def workload_name(self) -> str:
        return self.workload if self.workload is not None else DEFAULT_WORKLOADS[self.mode]

    def parts(self, workload: Workload) -> tuple[str, ...]:
        """The parts to run, after checking that the workload defines them."""
        if self.mode == "all":
            return workload.parts
        part = self.mode.replace("-", "_")
        if part not in workload.parts:
            raise ConfigError(
                f"workload {workload.name!r} has no {part!r} section (it has "
                f"{', '.join(workload.parts) or 'none'}): choose another workload or mode"
            )
        return (part,)

    def output_path(self, workload: Workload) -> Path:
        if self.output is not None:
            return self.output
        return Path("lrft_bench") / f"{workload.name}-{self.mode}.json"

    def work_directory(self) -> Path:
        if self.work_dir is not None:
            return self.work_dir
        return Path(tempfile.gettempdir()) / "lrft-bench"


def _release() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run(settings: BenchSettings) -> dict[str, Any]:
    """Run the parts and return the document (every rank returns it; rank 0 writes it after
    each part).

    Errors in the workload or the settings are raised before any process group starts.
    """
    from lrft.dist import RankInfo

    workload = load_workload(settings.workload_name)
    parts = settings.parts(workload)
    work_dir = settings.work_directory()
    info = RankInfo.from_env()
    device = info.device
    if device.type == "cuda":
        torch.cuda.set_device(device)
    ceiling = matmul_tflops(
        device, size=workload.ceilings.matmul_size, repeats=workload.ceilings.repeats
    )
    document: dict[str, Any] = {
        "schema": SCHEMA,
        "mode": settings.mode,
        "workload": workload.as_dict(),
        "environment": environment(device, info.world_size),
        "ceilings": {
            "matmul_tflops": ceiling,
            "matmul_dtype": str(compute_dtype(device)).removeprefix("torch."),
            "matmul_size": workload.ceilings.matmul_size,
        },
    }
    # Written after each part, so that a run stopped part-way (a time limit) keeps what it
    # measured; ``parts_pending`` names what it did not reach (empty once complete).
    document["parts_pending"] = list(parts)
    path = settings.output_path(workload)
    for part in parts:
        document[part] = _run_part(part, workload, settings, work_dir, ceiling)
        document["parts_pending"] = document["parts_pending"][1:]
        if info.rank == 0:
            write_json(document, path)
        _release()
    if info.rank == 0:
        print(table(document), flush=True)
        print(f"written to {path}", flush=True)
    return document


def _run_part(
    part: str, workload: Workload, settings: BenchSettings, work_dir: Path, ceiling: float
) -> dict[str, Any]:
    if part == "grpo":
        from lrft.bench.grpo import run_grpo

        return run_grpo(workload, work_dir=work_dir, steps=settings.steps, matmul_tflops=ceiling)
    if part == "train_mfu" and workload.train_mfu is not None and workload.train_mfu.ragged:
        from lrft.bench.train_packing import run_ragged_train

        return run_ragged_train(workload, steps=settings.steps, matmul_tflops=ceiling)
    if part == "train_mfu":
        from lrft.bench.train_mfu import run_train_mfu

        return run_train_mfu(workload, steps=settings.steps, matmul_tflops=ceiling)
    if part == "sync":
        from lrft.bench.sync import run_sync

        return run_sync(workload)
    assert part == "sleep", part
    from lrft.bench.sync import run_sleep

    return run_sleep(workload)
