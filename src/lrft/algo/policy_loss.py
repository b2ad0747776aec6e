"""Policy losses: PPO clip (dual clip, decoupled clip-higher), GSPO, GMPO and CPGD.

Every loss is minimised (it is the negated surrogate objective), reads a
:class:`~lrft.algo.types.PolicyLossInputs` and a :class:`~lrft.algo.types.PolicyLossConfig`, and
returns the loss with typed metrics. A loss raises ``ConfigError`` when the config sets something
it does not read (a dual clip for GSPO, an aggregation for a sequence-level loss), so no setting
is silently ignored.

Common steps: masked entries are replaced before any arithmetic (padding never reaches a value
or a gradient); the log-ratio ``log r = logp - old_logp`` is clamped to [-20, 20] before ``exp``
so that a stale or corrupt token cannot overflow (the clamp only acts where the ratio is already
beyond e^20); ``old_logprobs`` and ``engine_logprobs`` are detached.

Truncated importance sampling (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You
Off-Policy RL Training"): the engine samples from its own numerics, so with ``tis_cap`` set each
token loss is multiplied by the detached ``w = min(exp(old_logp - engine_logp), tis_cap)``;
sequence-level losses use the sequence weight ``min(exp(mean_t(old - engine)), tis_cap)``, the
geometric mean of the token ratios, as they do for the policy ratio itself.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from lrft.algo._tensor import fill_masked, masked_mean, mean_over_rows, nonempty_rows, sequence_mean
from lrft.algo.aggregation import aggregate_loss
from lrft.algo.registry import register_policy_loss
from lrft.algo.types import PolicyLossConfig, PolicyLossInputs, PolicyLossMetrics, PolicyLossOutput
from lrft.api.errors import ConfigError

LOG_RATIO_LIMIT = 20.0


class ClippedTokenLosses(NamedTuple):
    """Per-token losses and where each clip removed the gradient (bool, same shape)."""

    losses: Tensor
    clipped: Tensor
    dual_clipped: Tensor


def log_ratio(inputs: PolicyLossInputs) -> Tensor:
    """``clamp(logp - old_logp, -20, 20)``, 0 at masked positions; gradient flows to ``logp``."""
    mask = inputs.action_mask
    current = fill_masked(inputs.logprobs, mask)
    old = fill_masked(inputs.old_logprobs.detach().to(current.dtype), mask)
    return (current - old).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)


def sequence_log_ratio(inputs: PolicyLossInputs) -> Tensor:
    """(B,): ``(1/|y_i|) sum_t log r_it``, the log of GSPO's sequence ratio (0 for empty rows)."""
    return sequence_mean(log_ratio(inputs), inputs.action_mask)


def sequence_ratio(inputs: PolicyLossInputs) -> Tensor:
    """(B,): GSPO's ``s_i = (pi(y_i) / pi_old(y_i))^(1/|y_i|)``, the geometric mean of token ratios."""
    return torch.exp(sequence_log_ratio(inputs))


def ppo_token_losses(
    log_r: Tensor,
    advantages: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
) -> ClippedTokenLosses:
    """``max(-A r, -A clip(r, 1 - low, 1 + high))``, then for ``A < 0`` at most ``-A c``.

    PPO's clipped surrogate (Schulman et al. 2017, "Proximal Policy Optimization Algorithms");
    separate low/high bounds are DAPO's clip-higher (Yu et al. 2025, "DAPO"); the dual clip ``c``
    bounds the loss of negative-advantage tokens whose ratio exploded (Ye et al. 2020,
    "Mastering Complex Control in MOBA Games with Deep Reinforcement Learning").
    """
    ratio = torch.exp(log_r)
    unclipped = -advantages * ratio
    clipped_branch = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    clipped = clipped_branch > unclipped
    # where() rather than maximum(): a tie inside the trust region takes the unclipped gradient
    # whole instead of splitting it between two equal branches.
    losses = torch.where(clipped, clipped_branch, unclipped)
    dual_clipped = torch.zeros_like(clipped)
    if dual_clip is not None:
        cap = -advantages * dual_clip
        dual_clipped = (advantages < 0) & (losses > cap)
        losses = torch.where(dual_clipped, cap, losses)
    return ClippedTokenLosses(losses=losses, clipped=clipped, dual_clipped=dual_clipped)


def _reject_unread(config: PolicyLossConfig, loss: str, **unread: bool) -> None:
    for setting, is_set in unread.items():
        if is_set:
            raise ConfigError(f"policy loss {loss!r} does not read {setting}; leave it unset")


def _token_is_weights(inputs: PolicyLossInputs, config: PolicyLossConfig) -> tuple[Tensor, Tensor]:
    """Detached (weights, truncated) per token; weights are 1 when the correction is off."""
    mask = inputs.action_mask
    if config.tis_cap is None:
        return torch.ones_like(inputs.old_logprobs), torch.zeros_like(mask)
    if inputs.engine_logprobs is None:
        raise ValueError("tis_cap is set but no engine_logprobs were given")
    old = fill_masked(inputs.old_logprobs.detach(), mask)
    engine = fill_masked(inputs.engine_logprobs.detach().to(old.dtype), mask)
    raw = torch.exp((old - engine).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
    return raw.clamp(max=config.tis_cap), mask & (raw > config.tis_cap)


def _sequence_is_weights(
    inputs: PolicyLossInputs, config: PolicyLossConfig
) -> tuple[Tensor, Tensor]:
    """Detached (weights, truncated) per sequence, from the mean token log-ratio old/engine."""
    rows = inputs.action_mask.shape[0]
    if config.tis_cap is None:
        ones = torch.ones(rows, dtype=inputs.old_logprobs.dtype, device=inputs.old_logprobs.device)
        return ones, torch.zeros_like(ones, dtype=torch.bool)
    if inputs.engine_logprobs is None:
        raise ValueError("tis_cap is set but no engine_logprobs were given")
    mask = inputs.action_mask
    diff = fill_masked(inputs.old_logprobs.detach(), mask) - fill_masked(
        inputs.engine_logprobs.detach().to(inputs.old_logprobs.dtype), mask
    )
    raw = torch.exp(sequence_mean(diff, mask).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
    return raw.clamp(max=config.tis_cap), raw > config.tis_cap


def _metrics(
    log_r: Tensor,
    mask: Tensor,
    *,
    clipped: Tensor,
    clip_over: Tensor,
    dual_clipped: Tensor,
    is_weights: Tensor,
    is_truncated: Tensor,
    is_over: Tensor,
) -> PolicyLossMetrics:
    """``clip_over`` / ``is_over``: the validity mask matching ``clipped`` / the IS weights."""
    with torch.no_grad():
        lr = log_r.detach()
        ratio = torch.exp(lr)
        return PolicyLossMetrics(
            clip_fraction=masked_mean(clipped.to(lr.dtype), clip_over),
            dual_clip_fraction=masked_mean(dual_clipped.to(lr.dtype), clip_over),
            approx_kl=masked_mean(ratio - 1.0 - lr, mask),
            ratio_mean=masked_mean(ratio, mask),
            is_weight_mean=masked_mean(is_weights.to(lr.dtype), is_over),
            is_truncated_fraction=masked_mean(is_truncated.to(lr.dtype), is_over),
        )


@register_policy_loss("ppo")
def ppo_loss(inputs: PolicyLossInputs, config: PolicyLossConfig) -> PolicyLossOutput:
    """PPO clipped surrogate per token, with optional dual clip and decoupled low/high bounds.

    ``L_t = max(-A_t r_t, -A_t clip(r_t, 1 - eps_low, 1 + eps_high))``; with ``dual_clip = c``,
    ``L_t = min(L_t, -A_t c)`` where ``A_t < 0``; aggregated by ``config.aggregation``.
    """
    _reject_unread(config, "ppo", cpgd_drift_coef=config.cpgd_drift_coef > 0)
    mask = inputs.action_mask
    log_r = log_ratio(inputs)
    advantages = fill_masked(inputs.advantages.detach().to(log_r.dtype), mask)
    token = ppo_token_losses(
        log_r,
        advantages,
        clip_low=config.clip_low,
        clip_high=config.clip_high,
        dual_clip=config.dual_clip,
    )
    weights, truncated = _token_is_weights(inputs, config)
    loss = aggregate_loss(
        token.losses * weights, mask, config.token_aggregation, max_len=config.max_len
    )
    metrics = _metrics(
        log_r,
        mask,
        clipped=token.clipped,
        clip_over=mask,
        dual_clipped=token.dual_clipped,
        is_weights=weights,
        is_truncated=truncated,
        is_over=mask,
    )
    return PolicyLossOutput(loss=loss, metrics=metrics)


def _sequence_advantages(inputs: PolicyLossInputs, dtype: torch.dtype) -> Tensor:
    """(B,): each response's mean advantage over its valid tokens (its outcome advantage)."""
    advantages = inputs.advantages.detach().to(dtype)
    return sequence_mean(fill_masked(advantages, inputs.action_mask), inputs.action_mask)


@register_policy_loss("gspo", sequence_level=True)
def gspo_loss(inputs: PolicyLossInputs, config: PolicyLossConfig) -> PolicyLossOutput:
    """GSPO: PPO's clip on the sequence ratio ``s_i = exp(mean_t log r_it)`` (Zheng et al. 2025,
    "Group Sequence Policy Optimization").

    ``L = mean_i max(-A_i s_i, -A_i clip(s_i, 1 - eps_low, 1 + eps_high))`` over the responses
    with a valid token, ``A_i`` the response's mean advantage. The gradient of ``s_i`` spreads
    evenly over the response's tokens, so long responses are not up-weighted.
    """
    _reject_unread(
        config,
        "gspo",
        dual_clip=config.dual_clip is not None,
        aggregation=config.aggregation is not None,
        cpgd_drift_coef=config.cpgd_drift_coef > 0,
    )
    mask = inputs.action_mask
    log_r = log_ratio(inputs)
    log_s = sequence_mean(log_r, mask)
    advantages = _sequence_advantages(inputs, log_r.dtype)
    # PPO's clipped surrogate, applied to one ratio per response instead of one per token.
    seq = ppo_token_losses(log_s, advantages, clip_low=config.clip_low, clip_high=config.clip_high)
    rows = nonempty_rows(mask)
    weights, truncated = _sequence_is_weights(inputs, config)
    loss = mean_over_rows(seq.losses * weights, rows)
    metrics = _metrics(
        log_r,
        mask,
        clipped=seq.clipped,
        clip_over=rows,
        dual_clipped=seq.dual_clipped,
        is_weights=weights,
        is_truncated=truncated,
        is_over=rows,
    )
    return PolicyLossOutput(loss=loss, metrics=metrics)


@register_policy_loss("gmpo", sequence_level=True)
def gmpo_loss(inputs: PolicyLossInputs, config: PolicyLossConfig) -> PolicyLossOutput:
    """GMPO: maximise the geometric mean of clipped token ratios (Zhao et al. 2025,
    "Geometric-Mean Policy Optimization").

    With ``g = sign(A_i)`` and ``c_t = clip(log r_t, -eps_low, eps_high)`` (log space):
    ``L = -mean_i A_i exp(mean_t g min(g log r_t, g c_t))``. The min is PPO's pessimism per
    token; the geometric mean damps outlier ratios that an arithmetic mean would pass through.
    """
    _reject_unread(
        config,
        "gmpo",
        dual_clip=config.dual_clip is not None,
        aggregation=config.aggregation is not None,
        cpgd_drift_coef=config.cpgd_drift_coef > 0,
    )
    mask = inputs.action_mask
    log_r = log_ratio(inputs)
    advantages = _sequence_advantages(inputs, log_r.dtype)
    sign = torch.sign(advantages).unsqueeze(-1)
    clamped = log_r.clamp(-config.clip_low, config.clip_high)
    # g min(g log r, g c) is c where the clip binds on the side the advantage pushes towards,
    # log r elsewhere; c is constant there (clamp passes no gradient), as in PPO.
    clipped = mask & (sign * clamped < sign * log_r)
    pessimistic = torch.where(clipped, clamped, log_r)
    seq_ratio = torch.exp(sequence_mean(pessimistic, mask))
    rows = nonempty_rows(mask)
    weights, truncated = _sequence_is_weights(inputs, config)
    loss = mean_over_rows(-advantages * seq_ratio * weights, rows)
    metrics = _metrics(
        log_r,
        mask,
        clipped=clipped,
        clip_over=mask,
        dual_clipped=torch.zeros_like(clipped),
        is_weights=weights,
        is_truncated=truncated,
        is_over=rows,
    )
    return PolicyLossOutput(loss=loss, metrics=metrics)


@register_policy_loss("cpgd")
def cpgd_loss(inputs: PolicyLossInputs, config: PolicyLossConfig) -> PolicyLossOutput:
    """CPGD: a policy-gradient loss on the clipped log-ratio plus a policy-drift penalty
    (Liu et al. 2025, "CPGD: Toward Stable Rule-based Reinforcement Learning for Language Models").

    ``L_t = -min(A_t log r_t, A_t clip(log r_t, log(1 - eps_low), log(1 + eps_high)))
    + alpha (r_t - 1 - log r_t)``; the second term is the k3 estimate of KL(pi_old || pi) with
    ``alpha = cpgd_drift_coef``. Aggregated by ``config.aggregation``. Working on ``log r``
    instead of ``r`` keeps the gradient ``A grad log pi`` bounded where the ratio is large.
    """
    _reject_unread(config, "cpgd", dual_clip=config.dual_clip is not None)
    mask = inputs.action_mask
    log_r = log_ratio(inputs)
    advantages = fill_masked(inputs.advantages.detach().to(log_r.dtype), mask)
    low, high = math.log(1.0 - config.clip_low), math.log(1.0 + config.clip_high)
    unclipped = -advantages * log_r
    clipped_branch = -advantages * log_r.clamp(low, high)
    clipped = clipped_branch > unclipped
    token_losses = torch.where(clipped, clipped_branch, unclipped)
    if config.cpgd_drift_coef > 0:
        token_losses = token_losses + config.cpgd_drift_coef * (torch.exp(log_r) - 1.0 - log_r)
    weights, truncated = _token_is_weights(inputs, config)
    loss = aggregate_loss(
        token_losses * weights, mask, config.token_aggregation, max_len=config.max_len
    )
    metrics = _metrics(
        log_r,
        mask,
        clipped=clipped,
        clip_over=mask,
        dual_clipped=torch.zeros_like(clipped),
        is_weights=weights,
        is_truncated=truncated,
        is_over=mask,
    )
    return PolicyLossOutput(loss=loss, metrics=metrics)
