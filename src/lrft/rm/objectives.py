"""What one forward of ``lrft train-rm`` computes: the Bradley-Terry objective on preference pairs
(scalar RMs), the verdict cross-entropy on judge examples (generative RMs) or the step
cross-entropy on step-labelled examples (process RMs).

An objective turns a micro-batch of examples into a differentiable loss *sum* and named counts
(also sums). The trainer divides the loss by the objective's :meth:`size` of the whole global
batch (pairs, or verdict tokens), so each optimizer step follows the gradient of the mean over
the global batch, however it is split into ranks and micro-batches, and it adds up the counts
over ranks and micro-batches before :meth:`summary` turns them into means.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar

import attrs
import torch
from torch import Tensor

from lrft.rm.data import JudgeExample, PreferencePair, StepExample
from lrft.rm.loss import bradley_terry, step_cross_entropy, verdict_cross_entropy

E = TypeVar("E", PreferencePair, JudgeExample, StepExample, contravariant=True)


@attrs.frozen(kw_only=True)
class Measured:
    """One micro-batch: the loss sum (differentiable) and counts to add up across ranks."""

    loss_sum: Tensor
    counts: Mapping[str, float]


class Objective(Protocol[E]):
    @property
    def count_names(self) -> tuple[str, ...]:
        """The keys of :attr:`Measured.counts`, in a fixed order (they are all-reduced)."""
        ...

    def size(self, examples: Sequence[E]) -> int:
        """What the loss sum is a sum over (pairs, or verdict tokens) in ``examples``."""
        ...

    def measure(
        self, module: torch.nn.Module, examples: Sequence[E], device: torch.device
    ) -> Measured: ...

    def summary(self, totals: Mapping[str, float], loss_sum: float) -> dict[str, float]:
        """Means from counts summed over a whole batch or evaluation set."""
        ...


def right_padded(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """``(input_ids, attention_mask)``, rows left-aligned: transformers' classifier heads read
    the last token that is not padding, and positions start at 0 as they would alone."""
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for index, row in enumerate(rows):
        input_ids[index, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[index, : len(row)] = 1
    return input_ids, mask


@attrs.frozen(kw_only=True)
class PairObjective:
    """Bradley-Terry on ``r(prompt + chosen)`` against ``r(prompt + rejected)``, both scored in
    one forward (``score`` is the head's single logit)."""

    pad_id: int
    count_names: tuple[str, ...] = ("pairs", "correct", "chosen", "rejected")

    def size(self, examples: Sequence[PreferencePair]) -> int:
        return len(examples)

    def measure(
        self, module: torch.nn.Module, examples: Sequence[PreferencePair], device: torch.device
    ) -> Measured:
        rows = [e.chosen for e in examples] + [e.rejected for e in examples]
        input_ids, mask = right_padded(rows, self.pad_id)
        scores = module(input_ids=input_ids.to(device), attention_mask=mask.to(device)).logits[:, 0]
        count = len(examples)
        margins = [e.margin for e in examples]
        margin = torch.tensor(margins) if any(margins) else None
        stats = bradley_terry(scores[:count], scores[count:], margin)
        return Measured(
            loss_sum=stats.loss_sum,
            counts={
                "pairs": float(count),
                "correct": stats.correct,
                "chosen": stats.chosen_sum,
                "rejected": stats.rejected_sum,
            },
        )

    def summary(self, totals: Mapping[str, float], loss_sum: float) -> dict[str, float]:
        pairs = max(totals["pairs"], 1.0)
        return {
            "loss": loss_sum / pairs,
            "accuracy": totals["correct"] / pairs,
            "chosen_reward": totals["chosen"] / pairs,
            "rejected_reward": totals["rejected"] / pairs,
        }


@attrs.frozen(kw_only=True)
class VerdictObjective:
    """The next-token loss of each judge example's verdict tokens (the prompt is context)."""

    pad_id: int
    count_names: tuple[str, ...] = ("tokens", "correct_tokens", "examples", "exact")

    def size(self, examples: Sequence[JudgeExample]) -> int:
        return sum(e.length - e.target_start for e in examples)

    def measure(
        self, module: torch.nn.Module, examples: Sequence[JudgeExample], device: torch.device
    ) -> Measured:
        input_ids, mask = right_padded([e.input_ids for e in examples], self.pad_id)
        positions = torch.arange(input_ids.shape[1])[None, :]
        starts = torch.tensor([e.target_start for e in examples])[:, None]
        target_mask = (positions >= starts) & mask.bool()
        logits = module(input_ids=input_ids.to(device), attention_mask=mask.to(device)).logits
        stats = verdict_cross_entropy(logits, input_ids, target_mask)
        return Measured(
            loss_sum=stats.loss_sum,
            counts={
                "tokens": float(stats.tokens),
                "correct_tokens": stats.correct_tokens,
                "examples": float(len(examples)),
                "exact": stats.exact,
            },
        )

    def summary(self, totals: Mapping[str, float], loss_sum: float) -> dict[str, float]:
        tokens = max(totals["tokens"], 1.0)
        return {
            "loss": loss_sum / tokens,
            "token_accuracy": totals["correct_tokens"] / tokens,
            "verdict_accuracy": totals["exact"] / max(totals["examples"], 1.0),
        }


@attrs.frozen(kw_only=True)
class StepObjective:
    """Each labelled step's cross-entropy against the one-label token head's logit at the
    step's last token (:func:`lrft.rm.loss.step_cross_entropy`)."""

    pad_id: int
    count_names: tuple[str, ...] = ("steps", "correct_steps")

    def size(self, examples: Sequence[StepExample]) -> int:
        return sum(len(e.labels) for e in examples)

    def measure(
        self, module: torch.nn.Module, examples: Sequence[StepExample], device: torch.device
    ) -> Measured:
        input_ids, mask = right_padded([e.input_ids for e in examples], self.pad_id)
        logits = module(input_ids=input_ids.to(device), attention_mask=mask.to(device)).logits
        rows = torch.tensor([row for row, e in enumerate(examples) for _ in e.positions])
        positions = torch.tensor([p for e in examples for p in e.positions])
        labels = torch.tensor([label for e in examples for label in e.labels])
        stats = step_cross_entropy(logits[rows.to(device), positions.to(device), 0], labels)
        return Measured(
            loss_sum=stats.loss_sum,
            counts={"steps": float(stats.steps), "correct_steps": stats.correct},
        )

    def summary(self, totals: Mapping[str, float], loss_sum: float) -> dict[str, float]:
        steps = max(totals["steps"], 1.0)
        return {"loss": loss_sum / steps, "step_accuracy": totals["correct_steps"] / steps}
