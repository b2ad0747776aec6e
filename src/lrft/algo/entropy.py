"""Token entropy from logits: the entropy bonus and high-entropy token selection."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lrft.algo._tensor import as_mask, check_2d, check_same_shape, fill_masked
from lrft.algo.aggregation import aggregate_loss
from lrft.algo.types import AggregationMode


def entropy_from_logits(logits: Tensor, action_mask: Tensor) -> Tensor:
    """(B, T, V) logits -> (B, T) entropy ``H = -sum_v p_v log p_v``, ``p = softmax(logits)``.

    0 at masked positions. Logits of ``-inf`` (a vocabulary entry ruled out) contribute 0, with a
    finite gradient.
    """
    mask = as_mask(action_mask)
    check_2d("action_mask", mask)
    if logits.dim() != 3 or logits.shape[:2] != mask.shape:
        raise ValueError(
            f"logits must have shape (B, T, V) with (B, T) = {tuple(mask.shape)}, "
            f"got {tuple(logits.shape)}"
        )
    # Padded rows may hold anything; replace them before softmax so no NaN reaches a gradient.
    safe_logits = torch.where(mask.unsqueeze(-1), logits, torch.zeros_like(logits))
    log_p = torch.log_softmax(safe_logits, dim=-1)
    # p log p -> 0 where p = 0: use 0 for log p there, else 0 * -inf would be NaN.
    finite_log_p = torch.where(torch.isfinite(log_p), log_p, torch.zeros_like(log_p))
    entropy = -(torch.exp(log_p) * finite_log_p).sum(dim=-1)
    return fill_masked(entropy, mask)


def entropy_bonus(
    logits: Tensor,
    action_mask: Tensor,
    *,
    aggregation: AggregationMode = "token-mean",
    max_len: int | None = None,
) -> Tensor:
    """The aggregated token entropy; the trainer adds ``-coef * entropy_bonus`` to the loss.

    An exploration bonus as in PPO (Schulman et al. 2017, eq. 9, the ``c2 S[pi]`` term).
    """
    return aggregate_loss(
        entropy_from_logits(logits, action_mask), action_mask, aggregation, max_len=max_len
    )


def high_entropy_token_mask(entropy: Tensor, action_mask: Tensor, top_fraction: float) -> Tensor:
    """(B, T) bool: the ``ceil(top_fraction * N)`` valid tokens of highest entropy, N valid tokens.

    Training only on these "forking" tokens is the rule of Wang et al. 2025 ("Beyond the 80/20
    Rule: High-Entropy Minority Tokens Drive Effective Reinforcement Learning for LLM
    Reasoning", 20% in the paper). The selection is over this batch (this rank's, under data
    parallelism). Ties at the threshold are broken arbitrarily so that exactly that many are kept.
    Use the result as the ``action_mask`` of the policy loss.
    """
    if not 0.0 < top_fraction <= 1.0:
        raise ValueError(f"top_fraction must be in (0, 1], got {top_fraction!r}")
    mask = as_mask(action_mask)
    check_2d("entropy", entropy)
    check_same_shape("entropy", entropy, action_mask=mask)
    valid = int(mask.sum().item())
    # round() first: 0.1 * 30 is 3.0000000000000004 in floating point, whose ceil would be 4.
    keep = min(valid, math.ceil(round(top_fraction * valid, 9)))
    selected = torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
    if keep > 0:
        scores = torch.where(mask, entropy.detach(), torch.full_like(entropy, -torch.inf))
        selected[torch.topk(scores.reshape(-1), keep).indices] = True
    return selected.reshape(mask.shape) & mask
