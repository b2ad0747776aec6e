"""What the two sides of a split placement agree on: the messages the rollout ranks and the
trainer's sender exchange, and the order of a run's syncs, evaluations and batches.

The trainer runs its usual loop (docs/trainer.md): a weight sync at the start, an evaluation
at step 0, then each iteration's batch, training, a weight sync of the new version, and the
evaluations ``eval_steps`` asks for. The rollout ranks follow :func:`rollout_events`, the same
syncs and evaluations in the same order, with each batch generated as soon as the weights it
may use have arrived: batch ``b`` right after the sync of version ``max(start, b - K)``. With
``K = 0`` every batch waits for the weights of the step before it (synchronous); with ``K >= 1``
the rollout ranks generate up to ``K`` batches ahead while the trainer trains, so batch ``b``,
trained at step ``b`` with the trainer at version ``b``, lags by at most ``K`` versions.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import attrs
import torch

from lrft.api.types import GenerationResult
from lrft.rewards import RewardOutput

BATCH_TAG = 1
"""The exchange tag of the rollout ranks' batches."""
EVAL_TAG = 2
"""The exchange tag of their held-out scores."""


@attrs.frozen(kw_only=True)
class RunStart:
    """What the trainer's sender tells every rollout rank before the first sync: the iteration
    the run starts from (0, or a resumed checkpoint's step), its last one, the prompt stream's
    position (the trainer's sampler state, so a resumed run loses or repeats no prompt), and
    when it evaluates."""

    step: int
    total: int
    sampler: Mapping[str, int | bool]
    evaluates: bool
    eval_every: int


@attrs.frozen(kw_only=True, eq=False)
class RolloutShare:
    """One rollout rank's share of one batch: the dataset indices of its prompts (in the
    sampler's order), ``n`` results per prompt (prompt-major), their rewards, the version of the
    weights that generated them, and how long generating and scoring took."""

    batch: int
    version: int
    indices: tuple[int, ...]
    results: tuple[GenerationResult, ...]
    scores: tuple[float, ...]
    reward_metrics: dict[str, tuple[float, ...]]
    seconds: Mapping[str, float]

    @classmethod
    def of(
        cls,
        *,
        batch: int,
        version: int,
        indices: tuple[int, ...],
        results: tuple[GenerationResult, ...],
        rewards: RewardOutput,
        seconds: Mapping[str, float],
    ) -> RolloutShare:
        # A RewardOutput keeps its metrics in a read-only mapping, which pickle refuses: the
        # share carries plain values and rebuilds it.
        return cls(
            batch=batch,
            version=version,
            indices=indices,
            results=results,
            scores=rewards.scores,
            reward_metrics=dict(rewards.metrics),
            seconds=dict(seconds),
        )

    @property
    def rewards(self) -> RewardOutput:
        return RewardOutput(scores=self.scores, metrics=self.reward_metrics)


@attrs.frozen(kw_only=True)
class EvalShare:
    """One rollout rank's greedy held-out scores under the weights of ``version``, by the
    held-out prompt's dataset index."""

    version: int
    scores: Mapping[int, float]


def eval_due(version: int, *, start: int, total: int, every: int) -> bool:
    """Whether the trainer evaluates the weights of ``version`` in a run from ``start`` to
    ``total`` (``RLTrainer.fit``'s rule: at step 0 when the run starts there, every ``every``
    steps (``-1``: never), and at the end)."""
    if version == start:
        return start == 0
    return (every > 0 and version % every == 0) or version == total


def rollout_events(start: RunStart, max_staleness: int) -> Iterator[tuple[str, int]]:
    """The rollout ranks' run, in order: ``("sync", version)``, ``("eval", version)``,
    ``("generate", batch)``; see the module docstring."""
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    batch = start.step
    for version in range(start.step, start.total + 1):
        yield "sync", version
        if start.evaluates and eval_due(
            version, start=start.step, total=start.total, every=start.eval_every
        ):
            yield "eval", version
        while batch < start.total and batch - max_staleness <= version:
            yield "generate", batch
            batch += 1


def staleness_metrics(staleness: torch.Tensor, max_staleness: int) -> dict[str, float]:
    """A step's staleness histogram: the share of its samples ``k`` versions behind the
    trainer, for every ``k`` the bound allows (``staleness/k``), and the mean and maximum."""
    total = max(int(staleness.numel()), 1)
    metrics = {
        f"staleness/{k}": float((staleness == k).sum()) / total for k in range(max_staleness + 1)
    }
    metrics["staleness/mean"] = float(staleness.float().mean()) if staleness.numel() else 0.0
    metrics["staleness/max"] = float(staleness.max()) if staleness.numel() else 0.0
    return metrics
