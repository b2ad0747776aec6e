"""RL algorithms as pure tensor functions: no process groups, no models, no hidden state.

- advantages: ``gae``, ``reinforce``, ``reinforce++``, ``rloo``, ``reinforce_baseline``,
  ``group_norm`` (GRPO), ``dr_grpo``, ``cpgd``, and on-policy distillation
  (``on_policy_distillation``, ``on_policy_distillation_hybrid``) — then the single
  normalisation stage (:func:`normalize_advantages`, or both at once with
  :func:`compute_advantages`);
- policy losses: ``ppo`` (clip, dual clip, decoupled clip-higher), ``gspo``, ``gmpo``,
  ``cpgd``, each with optional truncated importance sampling against the engine's logprobs;
- loss aggregation, KL estimators and controllers, entropy bonus and high-entropy token
  selection, clipped value loss, DAPO dynamic sampling and overlong buffer, running reward
  statistics, FIRE first-token temperature;
- log-probabilities of chosen tokens from hidden states, a chunk of tokens at a time (never the
  whole batch's full-vocabulary logits);
- registries keyed by CLI name, to which users add their own (see :mod:`lrft.algo.registry`).

Distributed reductions are the trainer's: functions that need global statistics take them as
arguments (:class:`RunningMoments` merges exactly across ranks).
"""

from lrft.algo.advantages import (
    broadcast_to_tokens,
    cpgd,
    discounted_returns,
    dr_grpo,
    gae,
    gae_advantages,
    group_mean,
    group_norm,
    group_sizes,
    group_std,
    reinforce,
    reinforce_baseline,
    reinforce_plus_plus,
    rloo,
)
from lrft.algo.aggregation import aggregate_loss, aggregation_divisor
from lrft.algo.distillation import (
    LOG_RATIO_CLAMP,
    distillation_advantages,
    on_policy_distillation,
    on_policy_distillation_hybrid,
    with_teacher,
)
from lrft.algo.entropy import entropy_bonus, entropy_from_logits, high_entropy_token_mask
from lrft.algo.kl import (
    AdaptiveKLController,
    FixedKLController,
    KLController,
    k1,
    k2,
    k3,
    kl_loss,
    kl_penalized_rewards,
    low_var_kl,
    token_kl,
)
from lrft.algo.logprobs import chunked_token_logprobs
from lrft.algo.normalization import advantage_moments, compute_advantages, normalize_advantages
from lrft.algo.policy_loss import (
    ClippedTokenLosses,
    cpgd_loss,
    gmpo_loss,
    gspo_loss,
    log_ratio,
    ppo_loss,
    ppo_token_losses,
    sequence_log_ratio,
    sequence_ratio,
)
from lrft.algo.registry import (
    AdvantageEstimatorFn,
    AdvantageEstimatorSpec,
    KLEstimatorFn,
    KLEstimatorSpec,
    PolicyLossFn,
    PolicyLossSpec,
    Registry,
    advantage_estimators,
    kl_estimators,
    policy_losses,
    register_advantage_estimator,
    register_kl_estimator,
    register_policy_loss,
)
from lrft.algo.running_moments import RunningMoments
from lrft.algo.shaping import (
    DynamicSamplingFilter,
    dynamic_sampling_filter,
    fire_temperatures,
    overlong_penalty,
    scale_logits,
)
from lrft.algo.types import (
    AGGREGATION_MODES,
    AdvantageParams,
    Advantages,
    AggregationMode,
    CpgdWeight,
    PolicyLossConfig,
    PolicyLossInputs,
    PolicyLossMetrics,
    PolicyLossOutput,
    RewardBatch,
    group_ids_from_size,
)
from lrft.algo.value_loss import ValueLossOutput, clipped_value_loss

__all__ = [
    "AGGREGATION_MODES",
    "LOG_RATIO_CLAMP",
    "AdaptiveKLController",
    "AdvantageEstimatorFn",
    "AdvantageEstimatorSpec",
    "AdvantageParams",
    "Advantages",
    "AggregationMode",
    "ClippedTokenLosses",
    "CpgdWeight",
    "DynamicSamplingFilter",
    "FixedKLController",
    "KLController",
    "KLEstimatorFn",
    "KLEstimatorSpec",
    "PolicyLossConfig",
    "PolicyLossFn",
    "PolicyLossInputs",
    "PolicyLossMetrics",
    "PolicyLossOutput",
    "PolicyLossSpec",
    "Registry",
    "RewardBatch",
    "RunningMoments",
    "ValueLossOutput",
    "advantage_estimators",
    "advantage_moments",
    "aggregate_loss",
    "aggregation_divisor",
    "broadcast_to_tokens",
    "chunked_token_logprobs",
    "clipped_value_loss",
    "compute_advantages",
    "cpgd",
    "cpgd_loss",
    "discounted_returns",
    "distillation_advantages",
    "dr_grpo",
    "dynamic_sampling_filter",
    "entropy_bonus",
    "entropy_from_logits",
    "fire_temperatures",
    "gae",
    "gae_advantages",
    "gmpo_loss",
    "group_ids_from_size",
    "group_mean",
    "group_norm",
    "group_sizes",
    "group_std",
    "gspo_loss",
    "high_entropy_token_mask",
    "k1",
    "k2",
    "k3",
    "kl_estimators",
    "kl_loss",
    "kl_penalized_rewards",
    "log_ratio",
    "low_var_kl",
    "normalize_advantages",
    "on_policy_distillation",
    "on_policy_distillation_hybrid",
    "overlong_penalty",
    "policy_losses",
    "ppo_loss",
    "ppo_token_losses",
    "register_advantage_estimator",
    "register_kl_estimator",
    "register_policy_loss",
    "reinforce",
    "reinforce_baseline",
    "reinforce_plus_plus",
    "rloo",
    "scale_logits",
    "sequence_log_ratio",
    "sequence_ratio",
    "token_kl",
    "with_teacher",
]
