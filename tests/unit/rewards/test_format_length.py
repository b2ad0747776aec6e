"""Format rewards and length shaping, against hand-written expected scores."""

from __future__ import annotations

import time

import pytest

from lrft.rewards import (
    OverlongPenalty,
    RegexFormatReward,
    RewardError,
    RewardSample,
    ThinkFormatReward,
    characters,
    compute_rewards,
)


def score(reward: ThinkFormatReward | RegexFormatReward, response: str) -> float:
    return compute_rewards(reward, [RewardSample(prompt="", response=response)]).scores[0]


@pytest.mark.parametrize(
    ("response", "boxed", "tag"),
    [
        ("<think>2+2 is 4</think> The answer is \\boxed{4}.", 1.0, 0.0),
        ("\n <think>\nstep 1\nstep 2\n</think>\n\\boxed{4}", 1.0, 0.0),
        ("<think>2+2</think><answer>4</answer>", 0.0, 1.0),
        ("<think>2+2</think>\n<answer> 4 </answer>\n", 0.0, 1.0),
        ("<think>2+2</think><answer>4</answer> trailing", 0.0, 0.0),
        ("<think>2+2</think><answer> </answer>", 0.0, 0.0),
        ("<think>   </think> \\boxed{4}", 0.0, 0.0),  # empty reasoning
        ("Sure! <think>x</think> \\boxed{4}", 0.0, 0.0),  # text before the block
        ("<think>x</think><think>y</think> \\boxed{4}", 0.0, 0.0),  # second block
        ("<think>x <think>y</think> \\boxed{4}", 0.0, 0.0),  # nested opening tag
        ("<think>x</think> the answer is 4", 0.0, 0.0),  # no box
        ("\\boxed{4}", 0.0, 0.0),
        ("<think>x \\boxed{4}", 0.0, 0.0),  # never closed
    ],
)
def test_think_format(response: str, boxed: float, tag: float) -> None:
    assert score(ThinkFormatReward(answer="boxed"), response) == boxed
    assert score(ThinkFormatReward(answer="tag"), response) == tag


def test_think_format_is_linear_on_long_unclosed_blocks() -> None:
    # A quadratic pattern takes seconds here; the linear one takes milliseconds.
    response = "<think>" + "a " * 50_000
    start = time.perf_counter()
    assert score(ThinkFormatReward(), response) == 0.0
    assert time.perf_counter() - start < 0.5


def test_regex_format_full_and_search() -> None:
    full = RegexFormatReward(pattern=r"Answer: \d+")
    search = RegexFormatReward(pattern=r"Answer: \d+", match="search", name="has_answer")
    assert [score(full, r) for r in ("Answer: 12", "So. Answer: 12", "Answer: x")] == [1, 0, 0]
    assert [score(search, r) for r in ("Answer: 12", "So. Answer: 12", "Answer: x")] == [1, 1, 0]
    with pytest.raises(ValueError, match="'match' must be in"):
        RegexFormatReward(pattern="x", match="prefix")  # type: ignore[arg-type]  # invalid on purpose


def lengths(*values: int) -> list[RewardSample]:
    return [RewardSample(prompt="", response="", metadata={"response_length": v}) for v in values]


def test_overlong_penalty_hand_values() -> None:
    # max 10, buffer 4: free up to 6, then -0.5 per token over 6 (factor 2 / buffer 4), -2 past 10
    reward = OverlongPenalty(max_length=10, buffer_length=4, penalty_factor=2.0)
    output = compute_rewards(reward, lengths(0, 6, 7, 9, 10, 11, 50))
    assert output.scores == pytest.approx([0.0, 0.0, -0.5, -1.5, -2.0, -2.0, -2.0])
    assert output.metrics["length"] == (0, 6, 7, 9, 10, 11, 50)


def test_overlong_penalty_by_characters() -> None:
    reward = OverlongPenalty(max_length=4, buffer_length=2, length=characters)
    batch = [RewardSample(prompt="long prompt", response=r) for r in ("ab", "abc", "abcdef")]
    assert compute_rewards(reward, batch).scores == pytest.approx([0.0, -0.5, -1.0])


def test_overlong_penalty_names_a_sample_without_a_length() -> None:
    batch = [*lengths(3), RewardSample(prompt="", response="x")]
    with pytest.raises(RewardError, match=r"'overlong' failed at sample 1: raised KeyError"):
        compute_rewards(OverlongPenalty(max_length=4, buffer_length=2), batch)
    with pytest.raises(RewardError, match=r"sample 0: .*must be an int >= 0, got -1"):
        compute_rewards(OverlongPenalty(max_length=4, buffer_length=2), lengths(-1))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_length": 4, "buffer_length": 5}, r"buffer_length \(5\) must be <= max_length \(4\)"),
        ({"max_length": 0, "buffer_length": 1}, "max_length must be > 0, got 0"),
        (
            {"max_length": 4, "buffer_length": 2, "penalty_factor": -1.0},
            "penalty_factor must be >= 0",
        ),
    ],
)
def test_overlong_penalty_validation(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        OverlongPenalty(**kwargs)  # type: ignore[arg-type]  # the dict holds ints and floats
