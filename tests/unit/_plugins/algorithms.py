"""What a user's ``--plugins`` module registers: an advantage estimator and a policy loss that
count their calls, so that a test sees the trainer use them."""

from __future__ import annotations

import torch

from lrft.algo import (
    AdvantageParams,
    Advantages,
    PolicyLossConfig,
    PolicyLossInputs,
    PolicyLossOutput,
    RewardBatch,
    broadcast_to_tokens,
    policy_losses,
    register_advantage_estimator,
    register_policy_loss,
)

CALLS = {"estimator": 0, "loss": 0}


@register_advantage_estimator("top_baseline", whiten=False, needs_groups=True)
def top_baseline(batch: RewardBatch, params: AdvantageParams) -> Advantages:
    """A_i = s_i - max of its group: only a prompt's best responses go unpunished."""
    CALLS["estimator"] += 1
    assert batch.group_ids is not None
    scores = batch.sequence_scores
    _, group = torch.unique(batch.group_ids, return_inverse=True)
    best = torch.full((int(group.max()) + 1,), -torch.inf, dtype=scores.dtype)
    best = best.scatter_reduce(0, group, scores, reduce="amax")
    per_token = broadcast_to_tokens(scores - best[group], batch.action_mask)
    return Advantages(advantages=per_token, returns=per_token, action_mask=batch.action_mask)


@register_policy_loss("ppo_counted")
def ppo_counted(inputs: PolicyLossInputs, config: PolicyLossConfig) -> PolicyLossOutput:
    """lrft's ppo loss, counting its calls."""
    CALLS["loss"] += 1
    return policy_losses.get("ppo").fn(inputs, config)
