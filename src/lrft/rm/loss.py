"""The reward-model losses, as sums over a micro-batch that the trainer divides by the global
count (pairs, or verdict tokens), so that an optimizer step's gradient is that of the mean over
the whole global batch however it is split into ranks and micro-batches.

- Bradley-Terry (scalar RMs): ``-log sigmoid(r_chosen - r_rejected - margin)`` per pair, the
  negative log-likelihood that the chosen response is preferred when preferences follow
  ``P(chosen > rejected) = sigmoid(r_chosen - r_rejected)``; an optional per-pair ``margin``
  asks for a gap of at least that size (Llama 2's margin loss).
- Verdict cross-entropy (generative RMs): the next-token negative log-likelihood of the verdict's
  tokens given the judge prompt, summed over those tokens.
- Step cross-entropy (process RMs): the binary cross-entropy of each step's label against
  ``sigmoid`` of the head's logit at the step's last token, summed over steps.
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F
from torch import Tensor


@attrs.frozen(kw_only=True)
class PairStats:
    """Sums over a micro-batch of pairs: the Bradley-Terry loss, the pairs the model orders
    right (``r_chosen > r_rejected``; a tie counts as wrong), and the scores."""

    loss_sum: Tensor
    """Differentiable; the sum of the pairs' losses."""
    correct: float
    chosen_sum: float
    rejected_sum: float


def bradley_terry(chosen: Tensor, rejected: Tensor, margin: Tensor | None = None) -> PairStats:
    """The Bradley-Terry loss of pairs whose scores are ``chosen[i]`` and ``rejected[i]``.

    ``logsigmoid`` keeps the loss finite for any gap (``log(sigmoid(x))`` underflows to ``-inf``
    for a gap below about -100 in fp32).
    """
    if chosen.shape != rejected.shape or chosen.dim() != 1:
        raise ValueError(
            f"chosen and rejected scores must be two vectors of one shape, got "
            f"{tuple(chosen.shape)} and {tuple(rejected.shape)}"
        )
    gap = chosen.float() - rejected.float()
    if margin is not None:
        gap = gap - margin.to(gap.device, gap.dtype)
    detached_chosen, detached_rejected = chosen.detach().float(), rejected.detach().float()
    return PairStats(
        loss_sum=-F.logsigmoid(gap).sum(),
        correct=float((detached_chosen > detached_rejected).sum()),
        chosen_sum=float(detached_chosen.sum()),
        rejected_sum=float(detached_rejected.sum()),
    )


@attrs.frozen(kw_only=True)
class TokenStats:
    """Sums over a micro-batch of judge examples: the verdict tokens' negative log-likelihood,
    how many of those tokens are the model's argmax, and the examples whose every verdict token
    is (teacher-forced exact match: exactly the examples a greedy judge answers with the
    target verdict)."""

    loss_sum: Tensor
    tokens: int
    correct_tokens: float
    exact: float


def verdict_cross_entropy(logits: Tensor, input_ids: Tensor, target_mask: Tensor) -> TokenStats:
    """The next-token loss of the tokens where ``target_mask`` is true.

    ``logits`` are ``(batch, length, vocab)`` for ``input_ids`` ``(batch, length)``; the token at
    position ``t`` is predicted from position ``t - 1``, so the first position is never a target.
    """
    predicted = logits[:, :-1].float()
    targets = input_ids[:, 1:].to(predicted.device)
    mask = target_mask[:, 1:].to(predicted.device)
    token_loss = F.cross_entropy(predicted.transpose(1, 2), targets, reduction="none")
    hits = (predicted.detach().argmax(-1) == targets) & mask
    misses = (~hits & mask).sum(-1)
    return TokenStats(
        loss_sum=(token_loss * mask).sum(),
        tokens=int(mask.sum()),
        correct_tokens=float(hits.sum()),
        exact=float(((misses == 0) & mask.any(-1)).sum()),
    )


@attrs.frozen(kw_only=True)
class StepStats:
    """Sums over a micro-batch of labelled steps: the binary cross-entropy, the steps, and the
    steps whose probability falls on their label's side of 1/2."""

    loss_sum: Tensor
    steps: int
    correct: float


def step_cross_entropy(logits: Tensor, labels: Tensor) -> StepStats:
    """``-[y log sigmoid(z) + (1 - y) log(1 - sigmoid(z))]`` summed over steps of logit ``z``
    and label ``y`` in [0, 1] (computed from the logit, finite for any ``z``)."""
    if logits.shape != labels.shape or logits.dim() != 1:
        raise ValueError(
            f"step logits and labels must be two vectors of one shape, got "
            f"{tuple(logits.shape)} and {tuple(labels.shape)}"
        )
    targets = labels.to(logits.device, torch.float32)
    predicted = logits.float()
    return StepStats(
        loss_sum=F.binary_cross_entropy_with_logits(predicted, targets, reduction="sum"),
        steps=int(labels.numel()),
        correct=float(((predicted.detach() > 0) == (targets >= 0.5)).sum()),
    )
