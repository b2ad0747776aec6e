"""Advantage estimators: rewards (and values) in, raw advantages and returns out.

No estimator here normalises its output over the batch. Whether that happens is declared when
the estimator is registered (``whiten=``) and done once, by
:func:`lrft.algo.normalize_advantages`. LightRFT whitened in several places (inside the
estimators and again in the loss), which silently changed the algorithm; here it is one stage.

Conventions shared by all estimators:

- Masked positions are skipped, not zeroed: the discount counts valid tokens, and GAE bootstraps
  from the next *valid* value. Outputs are 0 at masked positions.
- Outcome (group) estimators reduce each response to its score ``s_i = sum_t r_it m_it`` and
  broadcast the resulting advantage over the response's valid tokens; their returns equal their
  advantages (no critic learns from them).
- Group estimators need at least two responses per prompt and raise otherwise: a singleton group
  has no baseline, and lrft never invents one.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from lrft.algo._tensor import (
    as_mask,
    below_resolution,
    check_2d,
    check_same_shape,
    fill_masked,
)
from lrft.algo.registry import register_advantage_estimator
from lrft.algo.types import AdvantageParams, Advantages, RewardBatch


def broadcast_to_tokens(per_sequence: Tensor, action_mask: Tensor) -> Tensor:
    """(B,) -> (B, T): each row's value on its valid tokens, 0 elsewhere."""
    mask = as_mask(action_mask)
    expanded = per_sequence.unsqueeze(-1).expand(mask.shape)
    return fill_masked(expanded, mask)


def group_sizes(group_ids: Tensor) -> Tensor:
    """(B,): how many responses share each response's group."""
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    sizes: Tensor = counts[inverse]
    return sizes


def _group_moments(scores: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per response, in float64: its group's size, mean, and sum of squared deviations (m2).

    Sums run in float64, whatever the scores' dtype: a float32 mean leaves rounding noise of
    order 1e-7 in ``s - mean`` even when every score of the group is the same. The mean is then
    clamped into the group's ``[min, max]``, where the exact mean lies, so a group of equal
    scores has exactly that score as its mean and ``m2 == 0`` in any dtype.
    """
    values = scores.to(torch.float64)
    _, inverse, counts = torch.unique(
        group_ids.to(scores.device), return_inverse=True, return_counts=True
    )
    empty = values.new_zeros(counts.shape)
    sums = empty.index_add(0, inverse, values)
    lowest = torch.full_like(empty, torch.inf).scatter_reduce(0, inverse, values, reduce="amin")
    highest = torch.full_like(empty, -torch.inf).scatter_reduce(0, inverse, values, reduce="amax")
    sizes = counts.to(torch.float64)
    means = torch.clamp(sums / sizes, min=lowest, max=highest)
    m2 = empty.index_add(0, inverse, (values - means[inverse]) ** 2)
    return sizes[inverse], means[inverse], m2[inverse]


def group_mean(scores: Tensor, group_ids: Tensor) -> Tensor:
    """(B,): the mean score of each response's group, in ``scores``' dtype.

    Computed in float64; a group whose scores are all equal has exactly that score as mean.
    """
    _, means, _ = _group_moments(scores, group_ids)
    return means.to(scores.dtype)


def group_std(scores: Tensor, group_ids: Tensor, *, unbiased: bool) -> Tensor:
    """(B,): the standard deviation of each response's group, in ``scores``' dtype.

    ``unbiased`` divides the squared deviations by ``n - 1`` (Bessel), otherwise by ``n``.
    Computed in float64; exactly 0 for a group whose scores are all equal.
    """
    sizes, _, m2 = _group_moments(scores, group_ids)
    divisor = (sizes - 1 if unbiased else sizes).clamp(min=1)
    return torch.sqrt(m2 / divisor).to(scores.dtype)


def discounted_returns(token_rewards: Tensor, action_mask: Tensor, gamma: float) -> Tensor:
    """Reward-to-go ``G_t = sum_{j >= t} gamma^(k(j) - k(t)) r_j`` over the valid tokens.

    ``k(t)`` is the index of position ``t`` among its row's valid tokens (REINFORCE, Williams
    1992, "Simple statistical gradient-following algorithms for connectionist reinforcement
    learning"). 0 at masked positions.
    """
    mask = as_mask(action_mask)
    check_2d("token_rewards", token_rewards)
    check_same_shape("token_rewards", token_rewards, action_mask=mask)
    rewards = fill_masked(token_rewards.detach(), mask)
    returns = torch.zeros_like(rewards)
    running = rewards.new_zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        valid = mask[:, t]
        running = torch.where(valid, rewards[:, t] + gamma * running, running)
        returns[:, t] = torch.where(valid, running, 0.0)
    return returns


def gae_advantages(
    token_rewards: Tensor, values: Tensor, action_mask: Tensor, *, gamma: float, lambd: float
) -> tuple[Tensor, Tensor]:
    """Generalized Advantage Estimation over the valid tokens; returns (advantages, returns).

    With ``V_L = 0`` after the last valid token: ``delta_k = r_k + gamma V_{k+1} - V_k`` and
    ``A_k = sum_{j >= k} (gamma lambda)^(j - k) delta_j``; returns ``R_k = A_k + V_k`` (the
    critic's target, TD(lambda)). Schulman et al. 2016, "High-Dimensional Continuous Control
    Using Generalized Advantage Estimation". Indices count valid tokens only.
    """
    mask = as_mask(action_mask)
    check_2d("token_rewards", token_rewards)
    check_same_shape("token_rewards", token_rewards, values=values, action_mask=mask)
    rewards = fill_masked(token_rewards.detach(), mask)
    vals = fill_masked(values.detach().to(rewards.dtype), mask)
    advantages = torch.zeros_like(rewards)
    next_value = rewards.new_zeros(rewards.shape[0])
    next_advantage = rewards.new_zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        valid = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - vals[:, t]
        advantage = delta + gamma * lambd * next_advantage
        # A masked position is not a step: carry the next valid step's value and advantage past it.
        next_value = torch.where(valid, vals[:, t], next_value)
        next_advantage = torch.where(valid, advantage, next_advantage)
        advantages[:, t] = torch.where(valid, advantage, 0.0)
    returns = fill_masked(advantages + vals, mask)
    return advantages, returns


def _checked_groups(batch: RewardBatch, estimator: str) -> Tensor:
    if batch.group_ids is None:
        raise ValueError(f"{estimator} needs group_ids (or group_size): it compares responses")
    sizes = group_sizes(batch.group_ids)
    if bool((sizes < 2).any()):
        singles = sorted(set(batch.group_ids[sizes < 2].tolist()))
        raise ValueError(
            f"{estimator} needs at least 2 responses per prompt; groups {singles} have 1 "
            f"(n_samples_per_prompt must be >= 2)"
        )
    return batch.group_ids


class _Centred(NamedTuple):
    """Per response, in float64: score minus group mean, group size, group m2."""

    scores: Tensor
    sizes: Tensor
    m2: Tensor


def _centred(batch: RewardBatch, estimator: str) -> _Centred:
    """The checked groups' centred scores: the one centring every group estimator uses.

    A group whose spread is below the resolution of the scores' dtype (``below_resolution``:
    a root-mean-square deviation of at most ``RESOLUTION_ULPS`` machine epsilons of its mean)
    carries no signal: its centred scores and its m2 are exactly 0, so no estimator divides
    rounding noise by a standard deviation of the same size.
    """
    scores = batch.sequence_scores.detach()
    sizes, means, m2 = _group_moments(scores, _checked_groups(batch, estimator))
    flat = below_resolution(torch.sqrt(m2 / sizes), means, scores.dtype)
    centred = torch.where(flat, 0.0, scores.to(torch.float64) - means)
    return _Centred(scores=centred, sizes=sizes, m2=torch.where(flat, 0.0, m2))


def _outcome(batch: RewardBatch, per_sequence: Tensor) -> Advantages:
    per_token = broadcast_to_tokens(per_sequence.to(batch.token_rewards.dtype), batch.action_mask)
    return Advantages(
        advantages=per_token, returns=per_token.clone(), action_mask=batch.action_mask
    )


@register_advantage_estimator("gae", whiten=True, needs_values=True, reads=("gamma", "lambd"))
def gae(batch: RewardBatch, params: AdvantageParams) -> Advantages:
    """GAE(gamma, lambda) with a critic (Schulman et al. 2016); PPO whitens it afterwards."""
    if batch.values is None:
        raise ValueError("gae needs critic values (RewardBatch.values)")
    advantages, returns = gae_advantages(
        batch.token_rewards, batch.values, batch.action_mask, gamma=params.gamma, lambd=params.lambd
    )
    return Advantages(advantages=advantages, returns=returns, action_mask=batch.action_mask)


@register_advantage_estimator("reinforce", whiten=False, reads=("gamma",))
def reinforce(batch: RewardBatch, params: AdvantageParams) -> Advantages:
    """REINFORCE without baseline: A_t = G_t, the discounted reward-to-go (Williams 1992)."""
    returns = discounted_returns(batch.token_rewards, batch.action_mask, params.gamma)
    return Advantages(advantages=returns, returns=returns.clone(), action_mask=batch.action_mask)


@register_advantage_estimator("reinforce++", whiten=True, reads=("gamma",))
def reinforce_plus_plus(batch: RewardBatch, params: AdvantageParams) -> Advantages:
    """REINFORCE++: reward-to-go G_t, then global batch whitening (Hu 2025, "REINFORCE++").

    The raw output equals ``reinforce``; the difference is the declared whitening, applied by
    the normalisation stage over the whole (all-reduced) batch.
    """
    return reinforce(batch, params)


@register_advantage_estimator("rloo", whiten=False, needs_groups=True)
def rloo(batch: RewardBatch, params: AdvantageParams) -> Advantages:
    """RLOO: A_i = s_i - mean_{j != i} s_j over the prompt's group (Ahmadian et al. 2024,
    "Back to Basics: Revisiting REINFORCE Style Optimization for RLHF"; Kool et al. 2019).

    Computed as ``n / (n - 1) * (s_i - mean_group)``, which is the same number.
    """
    centred = _centred(batch, "rloo")
    return _outcome(batch, centred.sizes / (centred.sizes - 1) * centred.scores)


@register_advantage_estimator("reinforce_baseline", whiten=True, needs_groups=True)
def reinforce_baseline(batch: RewardBatch, params: AdvantageParams) -> Advantages:
    """REINFORCE++-baseline: A_i = s_i - mean_group(s), then global whitening (Hu 2025)."""
    return _outcome(batch, _centred(batch, "reinforce_baseline").scores)


@register_advantage_estimator(
    "group_norm", whiten=False, needs_groups=True, reads=("group_std_eps",)
)
def group_norm(batch: RewardBatch, params: AdvantageParams) -> Advantages:
    """GRPO: A_i = (s_i - mean_group) / (std_group + eps), std with Bessel's correction
    (Shao et al. 2024, "DeepSeekMath"; the unbiased std as in OpenRLHF and verl)."""
    centred = _centred(batch, "group_norm")
    std = torch.sqrt(centred.m2 / (centred.sizes - 1))
    return _outcome(batch, centred.scores / (std + params.group_std_eps))


@register_advantage_estimator("dr_grpo", whiten=False, needs_groups=True)
def dr_grpo(batch: RewardBatch, params: AdvantageParams) -> Advantages:
    """Dr. GRPO: A_i = s_i - mean_group(s), no std division (Liu et al. 2025, "Understanding
    R1-Zero-Like Training"): dividing by the std over-weights prompts that are nearly solved."""
    return _outcome(batch, _centred(batch, "dr_grpo").scores)


@register_advantage_estimator(
    "cpgd", whiten=False, needs_groups=True, reads=("group_std_eps", "cpgd_weight")
)
def cpgd(batch: RewardBatch, params: AdvantageParams) -> Advantages:
    """CPGD: A_i = w_i (s_i - mean_group); ``std`` weight w = 1 / (population std + eps),
    ``equal`` weight w = 1 (Liu et al. 2025, "CPGD: Toward Stable Rule-based Reinforcement
    Learning for Language Models"). Pair it with the ``cpgd`` policy loss."""
    centred = _centred(batch, "cpgd")
    if params.cpgd_weight == "equal":
        return _outcome(batch, centred.scores)
    std = torch.sqrt(centred.m2 / centred.sizes)
    return _outcome(batch, centred.scores / (std + params.group_std_eps))
