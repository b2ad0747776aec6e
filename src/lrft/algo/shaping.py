"""Reward and sampling shaping: DAPO's dynamic-sampling filter and overlong buffer, FIRE's
first-token temperature.

These are the pure parts. The refill loop of dynamic sampling (generate more prompts until the
batch is full again) belongs to the trainer; it asks :func:`dynamic_sampling_filter` which
responses to keep.
"""

from __future__ import annotations

import attrs
import torch
from torch import Tensor

from lrft.algo._tensor import as_mask, check_2d


@attrs.frozen(kw_only=True, eq=False)
class DynamicSamplingFilter:
    """``keep`` (B,) bool: responses whose group has a reward spread; and the group counts."""

    keep: Tensor
    kept_groups: int
    dropped_groups: int


def dynamic_sampling_filter(
    sequence_rewards: Tensor, group_ids: Tensor, *, atol: float = 0.0
) -> DynamicSamplingFilter:
    """Drop every group whose rewards are all equal (``max - min <= atol``).

    Such a group has zero advantage under any group baseline, so it only dilutes the gradient
    (DAPO, Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
    dynamic sampling: prompts with accuracy 0 or 1 are filtered out).
    """
    if sequence_rewards.dim() != 1 or group_ids.shape != sequence_rewards.shape:
        raise ValueError(
            f"sequence_rewards and group_ids must both have shape (B,), got "
            f"{tuple(sequence_rewards.shape)} and {tuple(group_ids.shape)}"
        )
    if atol < 0:
        raise ValueError(f"atol must be >= 0, got {atol!r}")
    labels, inverse = torch.unique(group_ids.to(sequence_rewards.device), return_inverse=True)
    groups = labels.numel()
    empty = sequence_rewards.new_empty(groups)
    highest = empty.fill_(-torch.inf).scatter_reduce(0, inverse, sequence_rewards, reduce="amax")
    lowest = torch.full_like(empty, torch.inf).scatter_reduce(
        0, inverse, sequence_rewards, reduce="amin"
    )
    group_keep = (highest - lowest) > atol
    kept = int(group_keep.sum().item())
    return DynamicSamplingFilter(
        keep=group_keep[inverse], kept_groups=kept, dropped_groups=groups - kept
    )


def overlong_penalty(
    response_lengths: Tensor, *, max_len: int, buffer_len: int, penalty_factor: float = 1.0
) -> Tensor:
    """DAPO's soft overlong punishment, (B,) floats to add to the sequence rewards.

    With ``L = max_len`` and ``C = buffer_len``: 0 for ``|y| <= L - C``; ``-f (|y| - (L - C)) / C``
    for ``L - C < |y| <= L`` (linear from 0 to ``-f``); ``-f`` beyond ``L``; ``f`` the
    ``penalty_factor`` (Yu et al. 2025, "DAPO", soft overlong punishment). A truncated response is punished
    smoothly instead of being rewarded like a finished one or zeroed abruptly.
    """
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    if not 0 < buffer_len <= max_len:
        raise ValueError(f"buffer_len must be in [1, max_len={max_len}], got {buffer_len}")
    if penalty_factor < 0:
        raise ValueError(f"penalty_factor must be >= 0, got {penalty_factor!r}")
    lengths = response_lengths.to(torch.float64)
    exceed = (lengths - (max_len - buffer_len)).clamp(0.0, float(buffer_len))
    return (-penalty_factor * exceed / buffer_len).to(torch.get_default_dtype())


def fire_temperatures(
    action_mask: Tensor, *, first_token_temperature: float, temperature: float
) -> Tensor:
    """(B, T): the sampling temperature of each response position under FIRE sampling.

    The first valid token of each row was sampled at ``first_token_temperature`` and every
    other position at ``temperature`` (Chen et al. 2024, "Flaming-hot Initiation with Regular
    Execution Sampling for Large Language Models"). Divide the logits by it
    (:func:`scale_logits`) to recompute log-probabilities under the distribution that sampled.
    """
    if not first_token_temperature > 0 or not temperature > 0:
        raise ValueError(
            f"temperatures must be > 0, got first_token_temperature={first_token_temperature!r}, "
            f"temperature={temperature!r}"
        )
    mask = as_mask(action_mask)
    check_2d("action_mask", mask)
    first = mask & (mask.cumsum(dim=-1) == 1)
    regular = torch.full(
        mask.shape, temperature, dtype=torch.get_default_dtype(), device=mask.device
    )
    return torch.where(first, first_token_temperature, regular)


def scale_logits(logits: Tensor, temperatures: Tensor) -> Tensor:
    """``logits / temperatures[..., None]`` for (B, T, V) logits and (B, T) temperatures."""
    if logits.dim() != 3 or logits.shape[:2] != temperatures.shape:
        raise ValueError(
            f"logits (B, T, V) and temperatures (B, T) disagree: {tuple(logits.shape)} and "
            f"{tuple(temperatures.shape)}"
        )
    return logits / temperatures.unsqueeze(-1).to(logits.dtype)
