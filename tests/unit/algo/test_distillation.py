"""On-policy distillation advantages against hand computations of LightRFT's formula,
``-opd_kl_coef * clamp(log p_student - log p_teacher, -20, 20)``, alone and added to GRPO's."""

from __future__ import annotations

import math

import pytest
import torch

from lrft.algo import (
    AdvantageParams,
    RewardBatch,
    advantage_estimators,
    compute_advantages,
    distillation_advantages,
)
from lrft.api.errors import ConfigError

NAN = float("nan")
STUDENT = torch.tensor([[-2.0, -0.5, -30.0], [-1.0, -1.0, NAN]])
TEACHER = torch.tensor([[-1.0, -1.5, -1.0], [-3.0, -1.0, 7.0]])
MASK = torch.tensor([[True, True, True], [True, True, False]])
# by hand, coef 0.5: row 0 log-ratios -1, 1, -29 (clamped to -20); row 1: 2, 0, padding
EXPECTED = [[0.5, -0.5, 10.0], [-1.0, 0.0, 0.0]]


def _batch(scores: list[float]) -> RewardBatch:
    batch = RewardBatch.from_sequence_rewards(torch.tensor(scores), MASK, group_size=2)
    return RewardBatch(
        token_rewards=batch.token_rewards,
        action_mask=MASK,
        group_ids=batch.group_ids,
        logprobs=STUDENT,
        teacher_logprobs=TEACHER,
    )


def test_the_distillation_advantage_by_hand() -> None:
    got = distillation_advantages(STUDENT, TEACHER, MASK, coef=0.5)
    assert got.tolist() == EXPECTED  # exact: every value is a short binary fraction
    # a teacher that likes the sampled token more than the student raises it, and vice versa
    assert got[0, 0] > 0 > got[0, 1]


def test_the_clamp_bounds_each_token_at_twenty_nats() -> None:
    student = torch.tensor([[-100.0, 0.0]])
    teacher = torch.tensor([[0.0, -100.0]])
    got = distillation_advantages(student, teacher, torch.ones(1, 2, dtype=torch.bool), coef=1.0)
    assert got.tolist() == [[20.0, -20.0]]


def test_on_policy_distillation_ignores_the_task_reward_and_is_not_whitened() -> None:
    params = AdvantageParams(opd_kl_coef=0.5)
    spec = advantage_estimators.get("on_policy_distillation")
    assert (spec.needs_teacher, spec.needs_groups, spec.whiten) == (True, False, False)
    for scores in ([1.0, 0.0], [7.0, -3.0]):
        result = compute_advantages("on_policy_distillation", _batch(scores), params)
        assert result.advantages.tolist() == EXPECTED
        assert result.returns.tolist() == EXPECTED


def test_the_hybrid_adds_the_grpo_advantage_of_the_task_reward() -> None:
    # group of two with scores 1 and 0: mean 0.5, Bessel std sqrt(0.5), so GRPO gives
    # +-0.5 / (sqrt(0.5) + 1e-6) to every valid token of each response
    grpo = 0.5 / (math.sqrt(0.5) + 1e-6)
    result = compute_advantages(
        "on_policy_distillation_hybrid", _batch([1.0, 0.0]), AdvantageParams(opd_kl_coef=0.5)
    )
    expected = [
        [0.5 + grpo, -0.5 + grpo, 10.0 + grpo],
        [-1.0 - grpo, 0.0 - grpo, 0.0],
    ]
    torch.testing.assert_close(result.advantages, torch.tensor(expected), rtol=0, atol=1e-6)
    spec = advantage_estimators.get("on_policy_distillation_hybrid")
    assert (spec.needs_teacher, spec.needs_groups, spec.whiten) == (True, True, False)
    assert spec.reads == {"opd_kl_coef", "group_std_eps"}


@pytest.mark.parametrize("name", ["on_policy_distillation", "on_policy_distillation_hybrid"])
def test_an_estimator_without_the_teachers_logprobs_is_refused(name: str) -> None:
    plain = RewardBatch.from_sequence_rewards(torch.tensor([1.0, 0.0]), MASK, group_size=2)
    with pytest.raises(ConfigError, match="needs the student's and a teacher's logprobs"):
        compute_advantages(name, plain)


def test_shapes_and_coefficients_are_checked() -> None:
    with pytest.raises(ValueError, match="teacher_logprobs has shape"):
        distillation_advantages(STUDENT, TEACHER[:, :2], MASK, coef=1.0)
    with pytest.raises(ConfigError, match="opd_kl_coef"):
        AdvantageParams(opd_kl_coef=0.0)
    with pytest.raises(ValueError, match="teacher_logprobs has shape"):
        RewardBatch(token_rewards=torch.zeros(2, 3), action_mask=MASK, teacher_logprobs=TEACHER[:1])
