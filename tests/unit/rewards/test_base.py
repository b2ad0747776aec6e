"""The reward contract: value types, the checked call and its error reports."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lrft.api.errors import ConfigError, LrftError
from lrft.rewards import (
    PerSampleReward,
    RewardError,
    RewardFn,
    RewardOutput,
    RewardSample,
    compute_rewards,
)


def samples(*responses: str) -> list[RewardSample]:
    return [RewardSample(prompt="Q: ", response=r) for r in responses]


class FailsOn:
    """A batch reward that scores len(response) and raises when it sees ``bad`` in a response."""

    name = "fails_on"

    def __init__(self, bad: str) -> None:
        self.bad = bad
        self.calls: list[int] = []

    def __call__(self, batch: Sequence[RewardSample]) -> RewardOutput:
        self.calls.append(len(batch))
        if any(self.bad in s.response for s in batch):
            raise KeyError("boom")
        return RewardOutput(scores=[float(len(s.response)) for s in batch])


class Returns:
    """A reward that returns a fixed object whatever it is given."""

    name = "returns"

    def __init__(self, value: object) -> None:
        self.value = value

    def __call__(self, batch: Sequence[RewardSample]) -> RewardOutput:
        return self.value  # type: ignore[return-value]  # deliberately breaks the contract


def test_sample_metadata_is_read_only_copy() -> None:
    metadata = {"response_length": 3}
    sample = RewardSample(prompt="p", response="r", metadata=metadata)
    metadata["response_length"] = 4
    assert sample.metadata["response_length"] == 3
    with pytest.raises(TypeError):
        sample.metadata["x"] = 1  # type: ignore[index]  # the point: the mapping is immutable


def test_output_accepts_tensor_or_sequence_and_compares_by_value() -> None:
    from_tensor = RewardOutput(scores=torch.tensor([0.5, -1.0]), metrics={"m": torch.ones(2)})
    from_list = RewardOutput(scores=[0.5, -1], metrics={"m": (1, 1)})
    assert from_tensor == from_list
    assert from_tensor.scores == (0.5, -1.0)
    assert len(from_tensor) == 2
    assert torch.equal(from_list.scores_tensor(), torch.tensor([0.5, -1.0]))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scores": torch.zeros(2, 1)}, r"one-dimensional, got shape \(2, 1\)"),
        ({"scores": "0.5"}, "sequence of numbers"),
        ({"scores": [1.0, 2.0], "metrics": {"m": [1.0]}}, "metric 'm' has 1 values for 2 scores"),
        ({"scores": [1.0], "metrics": {"": [1.0]}}, "metric names must not be empty"),
    ],
)
def test_output_rejects_malformed_values(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        RewardOutput(**kwargs)  # type: ignore[arg-type]  # malformed on purpose


def test_builtin_style_rewards_satisfy_the_protocol() -> None:
    assert isinstance(FailsOn("x"), RewardFn)
    assert isinstance(PerSampleReward(name="n", score=lambda s: 0.0), RewardFn)
    assert not isinstance(lambda batch: None, RewardFn)  # no name: not a reward


def test_compute_rewards_returns_checked_output() -> None:
    output = compute_rewards(FailsOn("!"), samples("ab", "abcd"))
    assert output.scores == (2.0, 4.0)


def test_a_raising_batch_names_the_sample_that_raises_alone() -> None:
    reward = FailsOn("bad")
    with pytest.raises(
        RewardError, match=r"reward 'fails_on' failed at sample 2: raised KeyError"
    ) as info:
        compute_rewards(reward, samples("ok", "fine", "bad one", "ok"))
    assert info.value.sample_index == 2
    assert info.value.reward == "fails_on"
    assert isinstance(info.value, LrftError)
    # one batch call, then one call per sample up to the culprit
    assert reward.calls == [4, 1, 1, 1]


def test_a_batch_failure_no_sample_reproduces_has_no_index() -> None:
    class FailsOnPairs:
        name = "pairs"

        def __call__(self, batch: Sequence[RewardSample]) -> RewardOutput:
            if len(batch) > 1:
                raise RuntimeError("batch too big")
            return RewardOutput(scores=[1.0])

    with pytest.raises(RewardError, match="on a batch of 3 samples, and no sample alone") as info:
        compute_rewards(FailsOnPairs(), samples("a", "b", "c"))
    assert info.value.sample_index is None


def test_lrft_errors_pass_through_without_re_running_samples() -> None:
    class Misconfigured:
        name = "misconfigured"
        calls = 0

        def __call__(self, batch: Sequence[RewardSample]) -> RewardOutput:
            self.calls += 1
            raise ConfigError("pad_token_id is None")

    reward = Misconfigured()
    with pytest.raises(ConfigError, match="pad_token_id is None"):
        compute_rewards(reward, samples("a", "b"))
    assert reward.calls == 1


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_score_is_reported_with_its_index(bad: float) -> None:
    reward = Returns(RewardOutput(scores=[0.0, 1.0, bad, bad]))
    with pytest.raises(RewardError, match=r"'returns' failed at sample 2: .*non-finite") as info:
        compute_rewards(reward, samples("a", "b", "c", "d"))
    assert info.value.sample_index == 2


def test_a_nan_metric_is_allowed_as_not_measured() -> None:
    reward = Returns(RewardOutput(scores=[1.0], metrics={"m": [math.nan]}))
    assert math.isnan(compute_rewards(reward, samples("a")).metrics["m"][0])


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (RewardOutput(scores=[1.0]), "returned 1 scores for 2 samples"),
        ([1.0, 2.0], "returned list, not a RewardOutput"),
    ],
)
def test_a_malformed_return_is_reported(value: object, message: str) -> None:
    with pytest.raises(RewardError, match=message):
        compute_rewards(Returns(value), samples("a", "b"))


def test_per_sample_reward_names_the_failing_index() -> None:
    reward = PerSampleReward(name="ratio", score=lambda s: 1.0 / len(s.response))
    assert compute_rewards(reward, samples("ab", "abcd")).scores == (0.5, 0.25)
    with pytest.raises(RewardError, match=r"'ratio' failed at sample 1: raised ZeroDivisionError"):
        compute_rewards(reward, samples("ab", "", "x"))


@pytest.mark.parametrize("name", ["", " math", "a/b"])
def test_reward_names_are_validated(name: str) -> None:
    with pytest.raises(ValueError, match=f"name must be a non-empty string.*got {name!r}"):
        PerSampleReward(name=name, score=lambda s: 0.0)


scores_with_holes = st.lists(
    st.one_of(st.floats(-10, 10), st.sampled_from([math.nan, math.inf, -math.inf])),
    min_size=1,
    max_size=8,
)


@settings(max_examples=40, deadline=None)
@given(values=scores_with_holes)
def test_compute_rewards_fails_exactly_on_the_first_non_finite_score(values: list[float]) -> None:
    batch = [RewardSample(prompt="", response=str(i)) for i in range(len(values))]
    reward = PerSampleReward(name="table", score=lambda s: values[int(s.response)])
    bad = [i for i, v in enumerate(values) if not math.isfinite(v)]
    if not bad:
        assert compute_rewards(reward, batch).scores == tuple(values)
        return
    with pytest.raises(RewardError) as info:
        compute_rewards(reward, batch)
    assert info.value.sample_index == bad[0]
