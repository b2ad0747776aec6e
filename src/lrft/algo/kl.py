"""KL between the policy and the reference model: estimators, in-reward and in-loss use, and the
coefficient controllers.

The estimators take the log-probabilities of the *sampled* tokens under the policy (``logp``)
and the reference (``ref``), with ``x = ref - logp = log(pi_ref / pi)``, and estimate
KL(pi || pi_ref) for tokens sampled from ``pi`` (J. Schulman, "Approximating KL Divergence",
2020, http://joschu.net/blog/kl-approx.html):

- ``k1 = -x``: unbiased, high variance, can be negative;
- ``k2 = x^2 / 2``: biased, low variance, non-negative;
- ``k3 = e^x - 1 - x``: unbiased and non-negative (``e^x >= 1 + x``), low variance;
- ``low_var_kl``: k3 with ``x`` clamped to [-20, 20] and the result to [-10, 10], as in verl, so
  that one token with a vanishing reference probability cannot dominate the loss.
"""

from __future__ import annotations

from typing import Protocol

import attrs
import torch
from torch import Tensor

from lrft.algo._tensor import as_mask, check_2d, check_same_shape, fill_masked
from lrft.algo.aggregation import aggregate_loss
from lrft.algo.registry import kl_estimators, register_kl_estimator
from lrft.algo.types import AggregationMode
from lrft.api import validators as c


@register_kl_estimator("k1")
def k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k1 = log pi - log pi_ref (Schulman 2020): unbiased, can be negative."""
    return logprobs - ref_logprobs


@register_kl_estimator("k2")
def k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k2 = (log pi - log pi_ref)^2 / 2 (Schulman 2020): biased, non-negative."""
    return 0.5 * (logprobs - ref_logprobs) ** 2


@register_kl_estimator("k3")
def k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k3 = pi_ref/pi - 1 - log(pi_ref/pi) (Schulman 2020): unbiased and non-negative."""
    x = ref_logprobs - logprobs
    return torch.expm1(x) - x


@register_kl_estimator("low_var_kl")
def low_var_kl(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k3 with the log-ratio clamped to [-20, 20] and the value to [-10, 10] (as in verl)."""
    x = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    return (torch.expm1(x) - x).clamp(-10.0, 10.0)


def token_kl(
    logprobs: Tensor, ref_logprobs: Tensor, action_mask: Tensor, estimator: str = "k1"
) -> Tensor:
    """(B, T): the registered ``estimator`` per valid token, 0 at masked positions."""
    mask = as_mask(action_mask)
    check_2d("logprobs", logprobs)
    check_same_shape("logprobs", logprobs, ref_logprobs=ref_logprobs, action_mask=mask)
    fn = kl_estimators.get(estimator).fn
    current = fill_masked(logprobs, mask)
    ref = fill_masked(ref_logprobs.detach().to(current.dtype), mask)
    return fill_masked(fn(current, ref), mask)


def kl_penalized_rewards(
    token_rewards: Tensor, kl: Tensor, action_mask: Tensor, coef: float
) -> Tensor:
    """KL in the reward: ``r_t - coef * kl_t`` on valid tokens, 0 elsewhere.

    The per-token penalty of Ziegler et al. 2019 ("Fine-Tuning Language Models from Human
    Preferences"); ``kl`` is usually :func:`token_kl` with ``k1`` of the behaviour policy at
    rollout time, detached here because a reward is a constant for the policy gradient.
    """
    mask = as_mask(action_mask)
    check_2d("token_rewards", token_rewards)
    check_same_shape("token_rewards", token_rewards, kl=kl, action_mask=mask)
    penalized = fill_masked(token_rewards, mask) - coef * fill_masked(kl.detach(), mask)
    return fill_masked(penalized, mask)


def kl_loss(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    action_mask: Tensor,
    *,
    estimator: str = "k3",
    aggregation: AggregationMode = "token-mean",
    max_len: int | None = None,
) -> Tensor:
    """KL in the loss: the aggregated per-token estimate, differentiable in ``logprobs``.

    GRPO's choice (Shao et al. 2024) is k3 added to the policy loss times the KL coefficient.
    """
    per_token = token_kl(logprobs, ref_logprobs, action_mask, estimator)
    return aggregate_loss(per_token, action_mask, aggregation, max_len=max_len)


class KLController(Protocol):
    """A KL coefficient and its rule to change; ``update`` returns the next controller."""

    @property
    def value(self) -> float: ...

    def update(self, current_kl: float, n_steps: int) -> KLController: ...


@attrs.frozen(kw_only=True)
class FixedKLController:
    """A constant coefficient."""

    value: float = attrs.field(validator=[c.finite, c.non_negative])

    def update(self, current_kl: float, n_steps: int) -> FixedKLController:
        return self


@attrs.frozen(kw_only=True)
class AdaptiveKLController:
    """The proportional controller of Ziegler et al. 2019 ("Fine-Tuning Language Models from
    Human Preferences"), in the form of their code (lm-human-preferences):

    ``e = clip(KL / target - 1, -0.2, 0.2)``, ``beta <- beta * (1 + e * n_steps / horizon)``,

    i.e. the paper's ``beta_{t+1} = beta_t (1 + K_beta e_t)`` with ``K_beta = n_steps / horizon``
    (``n_steps`` samples since the last update). Immutable: checkpoint it as three numbers.
    """

    value: float = attrs.field(validator=[c.finite, c.positive_number])
    target: float = attrs.field(validator=[c.finite, c.positive_number])
    horizon: int = attrs.field(validator=c.positive_int)

    def update(self, current_kl: float, n_steps: int) -> AdaptiveKLController:
        # Beyond one horizon the multiplier could reach 0 or flip sign (e = -0.2, n = 5 horizons);
        # within it, each update changes beta by at most 20%.
        if not 0 <= n_steps <= self.horizon:
            raise ValueError(f"n_steps must be in [0, horizon={self.horizon}], got {n_steps}")
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        return attrs.evolve(self, value=self.value * (1.0 + error * n_steps / self.horizon))
