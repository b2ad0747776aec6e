"""Math answer verification: hand-written responses and references with the expected verdicts.

One worker process serves the module (it starts in a few tenths of a second); the timeout tests
use their own reward so that killing its worker cannot disturb the others.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lrft.rewards import (
    MathVerifyReward,
    RewardError,
    RewardFn,
    RewardSample,
    compute_rewards,
)
from lrft.rewards import math_reward as math_reward_module


@pytest.fixture(scope="module")
def math_reward() -> Iterator[MathVerifyReward]:
    with MathVerifyReward() as reward:
        yield reward


def sample(response: str, reference: str | None) -> RewardSample:
    return RewardSample(prompt="Solve.", response=response, label="math", reference=reference)


CASES = [
    # (response, reference, expected score)
    ("So the answer is \\boxed{\\frac{1}{2}}.", "0.5", 1.0),
    ("So the answer is \\boxed{0.5}.", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\dfrac{2}{4}}", "Half: \\boxed{\\frac{1}{2}}", 1.0),
    ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}", 1.0),
    ("\\boxed{x = 5}", "5", 1.0),
    ("\\boxed{\\{2, 1\\}}", "\\{1, 2\\}", 1.0),
    ("\\boxed{2x+2}", "2(x+1)", 1.0),
    ("She pays 3 * 24 = 72 dollars.\n#### 72", "3 * 24 = 72\n#### 72", 1.0),
    ("#### 1,234", "#### 1234", 1.0),
    ("\\boxed{0.3333}", "\\frac{1}{3}", 0.0),  # rounded, not equal
    ("\\boxed{3}", "4", 0.0),
    ("\\boxed{2x+1}", "2(x+1)", 0.0),
    ("The answer is 4.", "4", 0.0),  # no boxed or #### answer: nothing extracted
    ("\\boxed{}", "4", 0.0),
]


def test_it_is_a_reward_fn(math_reward: MathVerifyReward) -> None:
    assert isinstance(math_reward, RewardFn)


def test_verdicts(math_reward: MathVerifyReward) -> None:
    batch = [sample(response, reference) for response, reference, _ in CASES]
    output = compute_rewards(math_reward, batch)
    assert output.scores == tuple(expected for _, _, expected in CASES)
    extracted = tuple(float(r not in ("The answer is 4.", "\\boxed{}")) for r, _, _ in CASES)
    assert output.metrics["extracted"] == extracted
    assert set(output.metrics["timeout"]) == {0.0}
    assert set(output.metrics["error"]) == {0.0}


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        (None, "sample 1: the sample has no reference answer"),
        ("   ", "sample 1: the reference is empty"),
        ("\\frac{", r"sample 1: parsing the reference answer '\\\\frac\{' with math-verify gave"),
    ],
)
def test_a_bad_reference_raises_naming_the_sample(
    math_reward: MathVerifyReward, reference: str | None, message: str
) -> None:
    batch = [sample("\\boxed{1}", "1"), sample("\\boxed{1}", reference)]
    with pytest.raises(RewardError, match=message):
        compute_rewards(math_reward, batch)


def test_a_pathological_answer_times_out_and_the_next_sample_is_still_judged() -> None:
    # 9^(9^9) has ~370 million digits: sympy works on it for well over 20 s; the worker is killed.
    with MathVerifyReward(timeout_s=0.5) as reward:
        compute_rewards(reward, [sample("\\boxed{1}", "1")])  # the worker is up
        batch = [sample("\\boxed{9^{9^{9}}}", "1"), sample("\\boxed{0.5}", "\\frac{1}{2}")]
        start = time.monotonic()
        output = compute_rewards(reward, batch)
        elapsed = time.monotonic() - start
    assert output.scores == (0.0, 1.0)
    assert output.metrics["timeout"] == (1.0, 0.0)
    assert output.metrics["extracted"] == (1.0, 1.0)
    assert elapsed < 10.0  # 0.5 s, a restart, and slack for a busy machine


def test_a_worker_that_died_between_calls_is_replaced(math_reward: MathVerifyReward) -> None:
    compute_rewards(math_reward, [sample("\\boxed{1}", "1")])
    process = math_reward._worker._process  # backdoor: the worker this reward started
    assert process is not None
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert compute_rewards(math_reward, [sample("\\boxed{2}", "2")]).scores == (1.0,)
    assert math_reward._worker._process is not process


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"timeout_s": 0.0}, "timeout_s must be > 0, got 0.0"),
        ({"timeout_s": float("inf")}, "timeout_s must be finite"),
        ({"formats": ()}, "formats must be a non-empty selection"),
        ({"formats": ("latex",)}, r"of \['boxed', 'gsm8k'\], got \['latex'\]"),
        ({"memory_limit_bytes": -1}, "memory_limit_bytes must be >= 0"),
    ],
)
def test_validation(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MathVerifyReward(**kwargs)  # type: ignore[arg-type]  # invalid on purpose


def test_without_math_verify_construction_names_the_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "math_verify" else find_spec(name, *args),
    )
    with pytest.raises(ImportError, match=r"pip install 'math-verify\[antlr4_13_2\]'"):
        MathVerifyReward()


def test_a_worker_that_cannot_start_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    broken = tmp_path / "worker.py"
    broken.write_text("import sys\nsys.exit(3)\n")
    monkeypatch.setattr(math_reward_module, "_WORKER_SCRIPT", broken)
    with (
        MathVerifyReward() as reward,
        pytest.raises(RewardError, match=r"worker did not start \(got \{'exited': 3\}"),
    ):
        compute_rewards(reward, [sample("\\boxed{1}", "1")])
