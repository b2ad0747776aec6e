"""The critic's loss with PPO value clipping."""

from __future__ import annotations

import attrs
import torch
from torch import Tensor

from lrft.algo._tensor import as_mask, check_2d, check_same_shape, fill_masked, masked_mean
from lrft.algo.aggregation import aggregate_loss
from lrft.algo.types import AggregationMode


@attrs.frozen(kw_only=True, eq=False)
class ValueLossOutput:
    """``loss`` and the detached share of valid tokens where the clipped term was larger."""

    loss: Tensor
    clip_fraction: Tensor


def clipped_value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    action_mask: Tensor,
    *,
    value_clip: float | None,
    aggregation: AggregationMode = "token-mean",
    max_len: int | None = None,
) -> ValueLossOutput:
    """``0.5 * max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2)`` aggregated over tokens.

    PPO's clipped value objective as implemented in OpenAI baselines' PPO2 (discussed in
    Engstrom et al. 2020, "Implementation Matters in Deep Policy Gradients"): the critic gains
    nothing from moving further than ``c = value_clip`` from its rollout-time values.
    ``value_clip=None`` gives the plain ``0.5 (V - R)^2``.
    """
    if value_clip is not None and not value_clip > 0:
        raise ValueError(f"value_clip must be > 0 or None, got {value_clip!r}")
    mask = as_mask(action_mask)
    check_2d("values", values)
    check_same_shape("values", values, old_values=old_values, returns=returns, action_mask=mask)
    current = fill_masked(values, mask)
    old = fill_masked(old_values.detach().to(current.dtype), mask)
    target = fill_masked(returns.detach().to(current.dtype), mask)
    unclipped = (current - target) ** 2
    if value_clip is None:
        token_losses = unclipped
        clipped = torch.zeros_like(mask)
    else:
        moved = old + (current - old).clamp(-value_clip, value_clip)
        clipped_branch = (moved - target) ** 2
        clipped = mask & (clipped_branch > unclipped)
        token_losses = torch.where(clipped, clipped_branch, unclipped)
    loss = 0.5 * aggregate_loss(token_losses, mask, aggregation, max_len=max_len)
    clip_fraction = masked_mean(clipped.to(current.dtype), mask).detach()
    return ValueLossOutput(loss=loss, clip_fraction=clip_fraction)
