"""The demo's rule reward against hand-written answers."""

from __future__ import annotations

import pytest

from lrft.api.errors import ConfigError
from lrft.demos.reward import AdditionReward
from lrft.demos.task import EOS_TEXT
from lrft.rewards import RewardError, RewardFn, RewardSample, compute_rewards


def sample(response: str, reference: str | None = "85") -> RewardSample:
    return RewardSample(prompt="47+38=", response=response, reference=reference)


RESPONSES = {
    "right": "85",
    "right, padded and ended": f" 85{EOS_TEXT}",
    "wrong": "84",
    "dropped carry": "75",
    "leading zero": "085",
    "trailing text": "85 apples",
    "empty": "",
    "words": "eighty-five",
}


def test_is_a_reward_fn() -> None:
    assert isinstance(AdditionReward(), RewardFn)
    assert AdditionReward().name == "addition"


def test_exact_answers_score_one_and_everything_else_zero() -> None:
    output = compute_rewards(AdditionReward(), [sample(r) for r in RESPONSES.values()])
    assert output.scores == (1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    assert output.metrics["correct"] == output.scores
    assert output.metrics["well_formed"] == (1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0)


def test_format_weight_credits_well_formed_wrong_answers_only() -> None:
    output = compute_rewards(
        AdditionReward(format_weight=0.1), [sample(r) for r in RESPONSES.values()]
    )
    assert output.scores == (1.0, 1.0, 0.1, 0.1, 0.0, 0.0, 0.0, 0.0)


def test_the_reference_is_compared_as_text_without_surrounding_space() -> None:
    reward = AdditionReward()
    assert reward([sample("85", reference=" 85\n")]).scores == (1.0,)
    assert reward([sample("85", reference="85.0")]).scores == (0.0,)


def test_a_sample_without_reference_is_named() -> None:
    with pytest.raises(RewardError, match="at sample 1: the sample has no reference") as error:
        compute_rewards(AdditionReward(), [sample("85"), sample("85", reference=None)])
    assert error.value.sample_index == 1


@pytest.mark.parametrize(("weight", "rule"), [(-0.1, ">= 0"), (1.0, "< 1"), (float("nan"), "")])
def test_format_weight_is_validated(weight: float, rule: str) -> None:
    with pytest.raises(ConfigError, match=f"format_weight must be.*{rule}"):
        AdditionReward(format_weight=weight)
