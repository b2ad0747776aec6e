"""OptimizerConfig and SchedulerConfig: hand-computed multipliers and validation messages."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lrft.api import OptimizerConfig, SchedulerConfig

# cos(pi/4) = sqrt(2)/2, so the cosine decay at a quarter of the way is (1 + sqrt(2)/2) / 2.
QUARTER_COSINE = (1 + math.sqrt(2) / 2) / 2


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (SchedulerConfig(), [1.0, 1.0, 1.0]),
        (SchedulerConfig(warmup_steps=3), [1 / 4, 2 / 4, 3 / 4, 1.0, 1.0, 1.0]),
        (
            # warm-up 1/3, 2/3; then 1 - progress over 4 steps, scaled into [0.1, 1]; then held.
            SchedulerConfig(kind="linear", warmup_steps=2, total_steps=6, min_lr_ratio=0.1),
            [1 / 3, 2 / 3, 1.0, 0.775, 0.55, 0.325, 0.1, 0.1, 0.1],
        ),
        (
            SchedulerConfig(kind="linear", total_steps=4),
            [1.0, 0.75, 0.5, 0.25, 0.0, 0.0],
        ),
        (
            SchedulerConfig(kind="cosine", warmup_steps=1, total_steps=5),
            [1 / 2, 1.0, QUARTER_COSINE, 0.5, 1 - QUARTER_COSINE, 0.0, 0.0],
        ),
        (
            SchedulerConfig(kind="cosine", total_steps=4, min_lr_ratio=0.2),
            [1.0, 0.2 + 0.8 * QUARTER_COSINE, 0.6, 0.2 + 0.8 * (1 - QUARTER_COSINE), 0.2, 0.2],
        ),
    ],
    ids=[
        "constant",
        "constant-warmup",
        "linear-warmup-floor",
        "linear",
        "cosine-warmup",
        "cosine-floor",
    ],
)
def test_multiplier_matches_hand_computed_values(
    config: SchedulerConfig, expected: list[float]
) -> None:
    got = [config.multiplier(step) for step in range(len(expected))]
    assert got == pytest.approx(expected, abs=1e-12)


@given(
    kind=st.sampled_from(["constant", "linear", "cosine"]),
    warmup=st.integers(0, 20),
    decay=st.integers(1, 50),
    floor=st.floats(0.0, 1.0),
)
def test_multiplier_rises_through_warmup_then_never_rises(
    kind: Any, warmup: int, decay: int, floor: float
) -> None:
    config = SchedulerConfig(
        kind=kind, warmup_steps=warmup, total_steps=warmup + decay, min_lr_ratio=floor
    )
    values = [config.multiplier(step) for step in range(warmup + decay + 5)]
    assert all(0.0 < a < b for a, b in itertools.pairwise(values[: warmup + 1]))
    assert values[warmup] == pytest.approx(1.0, abs=1e-12)
    after = values[warmup:]
    assert all(b <= a + 1e-12 for a, b in itertools.pairwise(after))
    lowest = 1.0 if kind == "constant" else floor
    assert after[-1] == pytest.approx(lowest, abs=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "step"}, r"'kind' must be in"),
        ({"warmup_steps": -1}, r"warmup_steps must be >= 0, got -1"),
        ({"min_lr_ratio": -0.5}, r"min_lr_ratio must be >= 0, got -0.5"),
        ({"min_lr_ratio": float("nan")}, r"min_lr_ratio must be finite"),
        ({"min_lr_ratio": 1.5}, r"min_lr_ratio must be <= 1, got 1.5"),
        (
            {"kind": "linear"},
            r"a linear schedule needs total_steps > warmup_steps, got total_steps=None",
        ),
        (
            {"kind": "cosine", "warmup_steps": 5, "total_steps": 5},
            r"total_steps > warmup_steps, got total_steps=5, warmup_steps=5",
        ),
    ],
)
def test_scheduler_config_rejects_bad_values_naming_the_field(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        SchedulerConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lr": 0.0}, r"lr must be > 0, got 0.0"),
        ({"lr": float("inf")}, r"lr must be finite"),
        ({"betas": (0.9, 1.0)}, r"betas must be two numbers in \[0, 1\), got \(0.9, 1.0\)"),
        ({"betas": (0.9,)}, r"betas must be two numbers"),
        ({"eps": 0.0}, r"eps must be > 0"),
        ({"weight_decay": -0.1}, r"weight_decay must be >= 0, got -0.1"),
        ({"max_grad_norm": float("nan")}, r"max_grad_norm must be finite"),
    ],
)
def test_optimizer_config_rejects_bad_values_naming_the_field(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        OptimizerConfig(**kwargs)


def test_optimizer_config_keeps_valid_values() -> None:
    config = OptimizerConfig(lr=3e-4, betas=[0.8, 0.9], eps=1e-6, weight_decay=0.1, max_grad_norm=0)
    assert (config.lr, config.betas, config.eps, config.weight_decay) == (
        3e-4,
        (0.8, 0.9),
        1e-6,
        0.1,
    )
    assert config.max_grad_norm == 0
