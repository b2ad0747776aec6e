"""The loop both updates (policy, critic) run: epochs over the replay buffer's shuffled fixed
micro-batches, an optimizer step every ``accumulation`` of them, and the metrics averaged over
what each step recorded."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from torch import Tensor

from lrft.api.types import StepReport
from lrft.trainer.replay import ReplayBuffer


class Metrics:
    """Running means of named values, each over the times it was recorded."""

    def __init__(self) -> None:
        self._totals: dict[str, float] = {}
        self._counts: dict[str, int] = {}

    def record(self, values: Mapping[str, float]) -> None:
        for name, value in values.items():
            self._totals[name] = self._totals.get(name, 0.0) + value
            self._counts[name] = self._counts.get(name, 0) + 1

    def record_step(self, report: StepReport) -> None:
        self.record(
            {"grad_norm": report.grad_norm, "skipped_steps": float(report.skipped), "lr": report.lr}
        )

    def averages(self, prefix: str) -> dict[str, float]:
        return {
            f"{prefix}/{name}": total / self._counts[name] for name, total in self._totals.items()
        }


def step_groups(
    buffer: ReplayBuffer,
    *,
    micro_batch_size: int,
    accumulation: int,
    epochs: int,
    step: int,
    what: str,
) -> Iterator[list[Tensor]]:
    """The fixed micro-batches (buffer row indices) of each optimizer step, epoch after epoch.

    The shuffle depends on the step and epoch only, so every update sees the same micro-batches
    in the same order. ``what`` names the update in the error for a buffer that leaves
    micro-batches without a step.
    """
    for epoch in range(epochs):
        groups = buffer.row_groups(micro_batch_size, epoch=step * 1000 + epoch)
        if len(groups) % accumulation:
            raise RuntimeError(
                f"{len(groups) % accumulation} {what} micro-batches were left without an "
                "optimizer step: the buffer size must be a multiple of micro_batch_size * "
                "accumulation"
            )
        for start in range(0, len(groups), accumulation):
            yield groups[start : start + accumulation]
