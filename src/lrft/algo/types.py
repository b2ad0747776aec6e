"""Typed inputs and outputs of the algorithm functions.

Tensors are response-aligned: position ``t`` of row ``i`` is the ``t``-th generated token of
response ``i``, and ``action_mask[i, t]`` says whether that position holds a real token. Rows may
be ragged (right padding) or have holes; every function reads the mask and nothing else to decide
what is valid, so values at masked positions never change a result.

The records hold tensors and are compared by identity (``eq=False``): element-wise ``==`` on
tensors has no single truth value.
"""

from __future__ import annotations

from typing import Literal, get_args

import attrs
import torch
from torch import Tensor

from lrft.algo._tensor import as_mask, check_2d, check_finite_float, check_same_shape, masked_sum
from lrft.api import validators as c
from lrft.api.errors import ConfigError

AggregationMode = Literal[
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
]
AGGREGATION_MODES: tuple[str, ...] = get_args(AggregationMode)

CpgdWeight = Literal["std", "equal"]


def group_ids_from_size(
    batch_size: int, group_size: int, device: torch.device | str | None = None
) -> Tensor:
    """Group ids ``[0]*n + [1]*n + ...`` for a batch laid out prompt-major, ``n`` samples each.

    This is the order ``generate`` returns (sample ``j`` of request ``i`` at ``i * n + j``).
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if batch_size % group_size:
        raise ValueError(
            f"batch size {batch_size} is not divisible by group_size {group_size} "
            f"(batch size % group_size = {batch_size % group_size}, must be 0)"
        )
    return torch.arange(batch_size, device=device) // group_size


def _resolve_groups(
    reference: Tensor, group_ids: Tensor | None, group_size: int | None
) -> Tensor | None:
    if group_ids is not None and group_size is not None:
        raise ValueError("give group_ids or group_size, not both")
    if group_size is not None:
        return group_ids_from_size(reference.shape[0], group_size, reference.device)
    return None if group_ids is None else group_ids.to(reference.device)


@attrs.frozen(kw_only=True, eq=False)
class RewardBatch:
    """What an advantage estimator reads.

    ``token_rewards`` (B, T): the reward of each generated token (an outcome reward sits on the
    last valid token; a KL penalty in the reward spreads over all of them). ``action_mask``
    (B, T): valid tokens. ``group_ids`` (B,): integer label of the prompt each response answers
    (responses to the same prompt share a label; labels need not be contiguous). ``values``
    (B, T): critic values, for GAE. ``logprobs`` (B, T): the behaviour (student) policy's
    log-probability of each sampled token, and ``teacher_logprobs`` (B, T) a teacher's, for
    on-policy distillation.
    """

    token_rewards: Tensor
    action_mask: Tensor = attrs.field(converter=as_mask)
    group_ids: Tensor | None = None
    values: Tensor | None = None
    logprobs: Tensor | None = None
    teacher_logprobs: Tensor | None = None

    def __attrs_post_init__(self) -> None:
        check_2d("token_rewards", self.token_rewards)
        check_finite_float("token_rewards", self.token_rewards)
        check_same_shape(
            "token_rewards",
            self.token_rewards,
            action_mask=self.action_mask,
            values=self.values,
            logprobs=self.logprobs,
            teacher_logprobs=self.teacher_logprobs,
        )
        if self.group_ids is not None:
            if self.group_ids.shape != (self.batch_size,):
                raise ValueError(
                    f"group_ids must have shape ({self.batch_size},) (one label per row of "
                    f"token_rewards), got {tuple(self.group_ids.shape)}"
                )
            if self.group_ids.is_floating_point() or self.group_ids.dtype == torch.bool:
                raise ValueError(f"group_ids must be an integer tensor, got {self.group_ids.dtype}")

    @classmethod
    def from_token_rewards(
        cls,
        token_rewards: Tensor,
        action_mask: Tensor,
        *,
        group_ids: Tensor | None = None,
        group_size: int | None = None,
        values: Tensor | None = None,
    ) -> RewardBatch:
        """Build from per-token rewards; ``group_size=n`` means consecutive blocks of ``n`` rows."""
        groups = _resolve_groups(token_rewards, group_ids, group_size)
        return cls(
            token_rewards=token_rewards, action_mask=action_mask, group_ids=groups, values=values
        )

    @classmethod
    def from_sequence_rewards(
        cls,
        sequence_rewards: Tensor,
        action_mask: Tensor,
        *,
        group_ids: Tensor | None = None,
        group_size: int | None = None,
        values: Tensor | None = None,
    ) -> RewardBatch:
        """Build from one reward per response, placed on the response's last valid token.

        The last token is where the outcome is known (the convention of PPO for language models,
        Ziegler et al. 2019), so discounted estimators see it as a terminal reward.
        """
        mask = as_mask(action_mask)
        check_2d("action_mask", mask)
        if sequence_rewards.shape != (mask.shape[0],):
            raise ValueError(
                f"sequence_rewards must have shape ({mask.shape[0]},), "
                f"got {tuple(sequence_rewards.shape)}"
            )
        lengths = mask.sum(dim=-1)
        if bool((lengths == 0).any()):
            empty = torch.nonzero(lengths == 0).flatten().tolist()
            raise ValueError(f"rows {empty} have no valid token to carry their sequence reward")
        positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
        last = torch.where(mask, positions, -1).amax(dim=-1)
        rewards = torch.zeros(mask.shape, dtype=sequence_rewards.dtype, device=mask.device)
        rows = torch.arange(mask.shape[0], device=mask.device)
        rewards[rows, last] = sequence_rewards.to(mask.device)
        return cls.from_token_rewards(
            rewards, mask, group_ids=group_ids, group_size=group_size, values=values
        )

    @property
    def batch_size(self) -> int:
        return int(self.token_rewards.shape[0])

    @property
    def sequence_scores(self) -> Tensor:
        """(B,): the sum of each response's token rewards over its valid tokens."""
        return masked_sum(self.token_rewards, self.action_mask, dim=-1)


@attrs.frozen(kw_only=True)
class AdvantageParams:
    """Settings of the advantage estimators; each reads the ones its registration lists
    (``AdvantageEstimatorSpec.reads``) and no other."""

    gamma: float = attrs.field(default=1.0, validator=c.unit_interval)
    """Discount per valid token (gae, reinforce, reinforce++)."""
    lambd: float = attrs.field(default=1.0, validator=c.unit_interval)
    """GAE lambda (gae)."""
    group_std_eps: float = attrs.field(default=1e-6, validator=[c.finite, c.positive_number])
    """Added to a group's standard deviation before dividing (group_norm, cpgd)."""
    cpgd_weight: CpgdWeight = attrs.field(default="std", validator=c.one_of("std", "equal"))
    """CPGD's weighting of the centred group score: ``std`` divides by the group std."""
    opd_kl_coef: float = attrs.field(default=1.0, validator=[c.finite, c.positive_number])
    """The weight of the distillation advantage (on_policy_distillation, and _hybrid)."""


@attrs.frozen(kw_only=True, eq=False)
class Advantages:
    """Advantages and returns, (B, T), zero at masked positions.

    ``normalized`` is true once :func:`lrft.algo.normalize_advantages` has run on them; that
    stage refuses to run twice, which is how lrft guarantees a single normalisation.
    """

    advantages: Tensor
    returns: Tensor
    action_mask: Tensor = attrs.field(converter=as_mask)
    normalized: bool = False

    def __attrs_post_init__(self) -> None:
        check_2d("advantages", self.advantages)
        check_same_shape(
            "advantages", self.advantages, returns=self.returns, action_mask=self.action_mask
        )


@attrs.frozen(kw_only=True, eq=False)
class PolicyLossInputs:
    """What a policy loss reads, all (B, T).

    ``logprobs``: the current policy's log-probabilities of the sampled tokens (with gradient).
    ``old_logprobs``: the behaviour policy's, recomputed by the trainer before the epochs.
    ``engine_logprobs``: the rollout engine's own, for the truncated importance-sampling
    correction (the engine and trainer compute slightly different numbers).
    """

    logprobs: Tensor
    old_logprobs: Tensor
    advantages: Tensor
    action_mask: Tensor = attrs.field(converter=as_mask)
    engine_logprobs: Tensor | None = None

    def __attrs_post_init__(self) -> None:
        check_2d("logprobs", self.logprobs)
        check_same_shape(
            "logprobs",
            self.logprobs,
            old_logprobs=self.old_logprobs,
            advantages=self.advantages,
            action_mask=self.action_mask,
            engine_logprobs=self.engine_logprobs,
        )


def _dual_clip(_: object, attribute: attrs.Attribute[float | None], value: float | None) -> None:
    if value is not None and not value > 1.0:
        raise ConfigError(
            f"{attribute.name} must be > 1 (it bounds the ratio from above for negative "
            f"advantages), got {value!r}"
        )


@attrs.frozen(kw_only=True)
class PolicyLossConfig:
    """Settings of the policy losses.

    The clip bounds are ``eps_clip_low`` and ``eps_clip_high`` when given, ``eps_clip``
    otherwise. PPO and GSPO clip the ratio to ``[1 - low, 1 + high]``; CPGD clips the log-ratio
    to ``[log(1 - low), log(1 + high)]``; GMPO clips the log-ratio to ``[-low, high]`` (its paper
    uses 0.4). GSPO's paper uses much smaller bounds than token-level PPO (3e-4 / 4e-4).
    """

    eps_clip: float = attrs.field(default=0.2, validator=c.open_unit_interval)
    eps_clip_low: float | None = attrs.field(
        default=None, validator=c.optional(c.open_unit_interval)
    )
    eps_clip_high: float | None = attrs.field(
        default=None, validator=c.optional(c.finite, c.positive_number)
    )
    dual_clip: float | None = attrs.field(default=None, validator=_dual_clip)
    """Dual-clip PPO's ``c``: for negative advantages the token loss is at most ``-A * c``."""
    aggregation: AggregationMode | None = attrs.field(
        default=None, validator=c.optional(c.one_of(*AGGREGATION_MODES))
    )
    """How token losses become a scalar; ``None`` is ``token-mean``. Token-level losses only:
    a sequence-level loss (``PolicyLossSpec.sequence_level``) rejects it."""
    max_len: int | None = attrs.field(default=None, validator=c.optional(c.positive_int))
    """The constant divisor of ``seq-mean-token-sum-norm`` (the generation length limit)."""
    tis_cap: float | None = attrs.field(
        default=None, validator=c.optional(c.finite, c.positive_number)
    )
    """Truncated importance sampling: weight ``min(exp(old - engine), tis_cap)`` when set."""
    cpgd_drift_coef: float = attrs.field(default=0.0, validator=[c.finite, c.non_negative])
    """CPGD's policy-drift coefficient (KL of the old policy from the current one, k3)."""

    def __attrs_post_init__(self) -> None:
        needs_max_len = self.aggregation == "seq-mean-token-sum-norm"
        if needs_max_len and self.max_len is None:
            raise ConfigError(
                "aggregation 'seq-mean-token-sum-norm' divides by a constant max_len; set max_len "
                "(the generation length limit)"
            )
        if not needs_max_len and self.max_len is not None:
            raise ConfigError(
                f"max_len={self.max_len} is read only by aggregation 'seq-mean-token-sum-norm', "
                f"got aggregation {self.aggregation!r}"
            )

    @property
    def token_aggregation(self) -> AggregationMode:
        """The aggregation a token-level loss uses: ``aggregation``, or ``token-mean``."""
        return "token-mean" if self.aggregation is None else self.aggregation

    @property
    def clip_low(self) -> float:
        return self.eps_clip if self.eps_clip_low is None else self.eps_clip_low

    @property
    def clip_high(self) -> float:
        return self.eps_clip if self.eps_clip_high is None else self.eps_clip_high


@attrs.frozen(kw_only=True, eq=False)
class PolicyLossMetrics:
    """Detached 0-dim tensors, so a trainer can all-reduce them without a host sync.

    ``clip_fraction``: share of valid tokens (of sequences, for sequence-level losses) whose
    gradient the clip removed. ``dual_clip_fraction``: share capped by the dual clip.
    ``approx_kl``: mean over valid tokens of ``r - 1 - log r`` with ``r = pi / pi_old``, the
    non-negative k3 estimate of KL(pi_old || pi). ``ratio_mean``: mean token ratio.
    ``is_weight_mean`` / ``is_truncated_fraction``: the truncated importance-sampling weights'
    mean and the share cut at ``tis_cap`` (1 and 0 when the correction is off).
    """

    clip_fraction: Tensor
    dual_clip_fraction: Tensor
    approx_kl: Tensor
    ratio_mean: Tensor
    is_weight_mean: Tensor
    is_truncated_fraction: Tensor

    def as_floats(self) -> dict[str, float]:
        """The metrics as Python floats (a host sync), for logging."""
        return {
            field.name: float(getattr(self, field.name).item())
            for field in attrs.fields(type(self))
        }


@attrs.frozen(kw_only=True, eq=False)
class PolicyLossOutput:
    loss: Tensor
    metrics: PolicyLossMetrics
