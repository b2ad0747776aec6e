"""Weighted combination per data label."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lrft.rewards import (
    CombinedReward,
    PerSampleReward,
    RewardError,
    RewardFn,
    RewardOutput,
    RewardSample,
    ThinkFormatReward,
    Weighted,
    compute_rewards,
)


class Counting:
    """Scores len(response); metric 'words'; records the batches it was given."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.batches: list[list[str]] = []

    def __call__(self, samples: Sequence[RewardSample]) -> RewardOutput:
        self.batches.append([s.response for s in samples])
        return RewardOutput(
            scores=[float(len(s.response)) for s in samples],
            metrics={"words": [float(len(s.response.split())) for s in samples]},
        )


def sample(label: str, response: str) -> RewardSample:
    return RewardSample(prompt="", response=response, label=label)


def test_weighted_sum_per_label_with_metrics() -> None:
    length = Counting("length")
    fmt = ThinkFormatReward(answer="boxed")
    reward = CombinedReward(
        routes={
            "math": [Weighted(reward=length, weight=0.5), Weighted(reward=fmt, weight=2.0)],
            "format": [Weighted(reward=fmt)],
        }
    )
    assert isinstance(reward, RewardFn)
    good = "<think>a</think>\\boxed{1}"  # 25 characters, format 1
    batch = [sample("math", good), sample("format", "plain"), sample("math", "ab cd")]
    output = compute_rewards(reward, batch)
    # math: 0.5 * length + 2 * format; format: 1 * format
    assert output.scores == (0.5 * 25 + 2.0, 0.0, 0.5 * 5 + 0.0)
    nan = math.nan
    assert output.metrics["length"] == pytest.approx((25.0, nan, 5.0), nan_ok=True)
    assert output.metrics["length/words"] == pytest.approx((1.0, nan, 2.0), nan_ok=True)
    assert output.metrics["format"] == (1.0, 0.0, 0.0)
    # each reward ran once, on the samples routed to it only
    assert length.batches == [[good, "ab cd"]]


def test_unknown_label_names_it_and_the_known_ones_before_scoring() -> None:
    length = Counting("length")
    reward = CombinedReward(
        routes={"math": [Weighted(reward=length)], "code": [Weighted(reward=length)]}
    )
    with pytest.raises(
        RewardError,
        match=r"'combined' failed at sample 1: label 'poetry' has no reward; known labels: \['code', 'math'\]",
    ):
        compute_rewards(reward, [sample("math", "x"), sample("poetry", "y")])
    assert length.batches == []


def test_a_failing_part_is_named_with_the_index_in_the_whole_batch() -> None:
    picky = PerSampleReward(name="picky", score=lambda s: 1.0 / (s.response != "bad"))
    reward = CombinedReward(
        routes={"a": [Weighted(reward=picky)], "b": [Weighted(reward=Counting("n"))]}
    )
    batch = [sample("b", "x"), sample("a", "ok"), sample("b", "y"), sample("a", "bad")]
    # picky sees the sub-batch ["ok", "bad"] and fails at its index 1, which is index 3 here
    with pytest.raises(
        RewardError, match=r"reward 'picky' failed at sample 3: raised ZeroDivisionError"
    ):
        compute_rewards(reward, batch)


def test_a_nan_from_a_part_is_named_with_the_index_in_the_whole_batch() -> None:
    nan_on_b = PerSampleReward(
        name="nan_on_b", score=lambda s: math.nan if s.response == "b" else 0.0
    )
    reward = CombinedReward(
        routes={"x": [Weighted(reward=nan_on_b)], "y": [Weighted(reward=Counting("n"))]}
    )
    with pytest.raises(RewardError, match=r"'nan_on_b' failed at sample 2: .*non-finite"):
        compute_rewards(reward, [sample("x", "a"), sample("y", "b"), sample("x", "b")])


def test_nested_combinations_report_the_outer_index() -> None:
    picky = PerSampleReward(name="picky", score=lambda s: 1.0 / (s.response != "bad"))
    inner = CombinedReward(routes={"a": [Weighted(reward=picky)]}, name="inner")
    outer = CombinedReward(
        routes={"a": [Weighted(reward=inner)], "b": [Weighted(reward=Counting("n"))]}
    )
    batch = [sample("b", "x"), sample("a", "ok"), sample("b", "y"), sample("a", "bad")]
    with pytest.raises(RewardError, match=r"'picky' failed at sample 3"):
        compute_rewards(outer, batch)


@pytest.mark.parametrize(
    ("routes", "message"),
    [
        ({}, "routes must map at least one label"),
        ({"math": []}, r"routes\['math'\] is empty"),
        ({"math": [Counting("n")]}, r"routes\['math'\] must hold Weighted parts, got Counting"),
        (
            {"a": [Weighted(reward=Counting("n"))], "b": [Weighted(reward=Counting("n"))]},
            "two different rewards are named 'n'",
        ),
    ],
)
def test_validation(routes: dict[str, list[object]], message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        CombinedReward(routes=routes)  # type: ignore[arg-type]  # malformed on purpose


def test_weights_must_be_finite() -> None:
    with pytest.raises(ValueError, match="weight must be finite, got inf"):
        Weighted(reward=Counting("n"), weight=math.inf)


weights = st.floats(-3, 3, allow_nan=False)


@settings(max_examples=40, deadline=None)
@given(
    labels=st.lists(st.sampled_from(["p", "q"]), min_size=1, max_size=6),
    w=st.tuples(weights, weights, weights),
)
def test_combined_score_is_the_weighted_sum_of_its_parts(
    labels: list[str], w: tuple[float, float, float]
) -> None:
    first = PerSampleReward(name="first", score=lambda s: float(len(s.response)))
    second = PerSampleReward(name="second", score=lambda s: float(s.response.count("a")))
    reward = CombinedReward(
        routes={
            "p": [Weighted(reward=first, weight=w[0]), Weighted(reward=second, weight=w[1])],
            "q": [Weighted(reward=second, weight=w[2])],
        }
    )
    batch = [sample(label, "a" * i + "b") for i, label in enumerate(labels)]
    expected = [
        w[0] * (i + 1) + w[1] * i if label == "p" else w[2] * i for i, label in enumerate(labels)
    ]
    assert compute_rewards(reward, batch).scores == pytest.approx(expected)


def test_a_part_no_sample_routes_to_is_still_called_with_an_empty_batch() -> None:
    # a reward model's forward is collective across ranks: a rank whose samples carry other
    # labels (or none at all) must call it too
    math_part, chat_part = Counting("math_part"), Counting("chat_part")
    reward = CombinedReward(
        routes={"math": [Weighted(reward=math_part)], "chat": [Weighted(reward=chat_part)]}
    )
    output = compute_rewards(reward, [sample("math", "abc")])
    assert output.scores == (3.0,)
    assert math_part.batches == [["abc"]]
    assert chat_part.batches == [[]]
    assert compute_rewards(reward, []).scores == ()
    assert math_part.batches[-1] == chat_part.batches[-1] == []
