"""PPO clipped value loss by hand and against its formula."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lrft.algo import clipped_value_loss
from tests.unit.algo._strategies import FAST, finite


def test_clipped_value_loss_by_hand() -> None:
    # value_clip 0.2, returns 2, old values 1.
    # Token 0: V = 1.5 -> unclipped (1.5 - 2)^2 = 0.25; clipped V = 1.2 -> 0.64; max = 0.64,
    #          from the clipped branch, whose V is constant: no gradient.
    # Token 1: V = 0.5 -> unclipped 2.25; clipped V = 0.8 -> 1.44; max = 2.25, gradient
    #          0.5 * 2 * (0.5 - 2) = -1.5, halved by the token mean.
    # loss = 0.5 * (0.64 + 2.25) / 2 = 0.7225
    values = torch.tensor([[1.5, 0.5]], requires_grad=True)
    out = clipped_value_loss(
        values,
        torch.tensor([[1.0, 1.0]]),
        torch.tensor([[2.0, 2.0]]),
        torch.ones(1, 2),
        value_clip=0.2,
    )
    assert out.loss.item() == pytest.approx(0.7225)
    assert out.clip_fraction.item() == pytest.approx(0.5)
    (grad,) = torch.autograd.grad(out.loss, values)
    torch.testing.assert_close(grad, torch.tensor([[0.0, -0.75]]))


def test_without_clip_it_is_half_the_squared_error() -> None:
    values = torch.tensor([[1.5, 0.5, 9.0]])
    out = clipped_value_loss(
        values,
        torch.zeros(1, 3),
        torch.tensor([[2.0, 2.0, 0.0]]),
        torch.tensor([[1, 1, 0]]),
        value_clip=None,
    )
    assert out.loss.item() == pytest.approx(0.5 * (0.25 + 2.25) / 2)
    assert out.clip_fraction.item() == 0.0


@FAST
@given(st.lists(st.tuples(finite, finite, finite), min_size=1, max_size=8), st.floats(0.01, 2.0))
def test_clipped_value_loss_equals_its_formula(
    tokens: list[tuple[float, float, float]], clip: float
) -> None:
    values = torch.tensor([[v for v, _, _ in tokens]], dtype=torch.float64)
    old = torch.tensor([[o for _, o, _ in tokens]], dtype=torch.float64)
    returns = torch.tensor([[r for _, _, r in tokens]], dtype=torch.float64)
    out = clipped_value_loss(values, old, returns, torch.ones_like(values), value_clip=clip)
    expected = [
        0.5 * max((v - r) ** 2, (o + min(max(v - o, -clip), clip) - r) ** 2) for v, o, r in tokens
    ]
    assert out.loss.item() == pytest.approx(sum(expected) / len(expected), rel=1e-9, abs=1e-12)


def test_value_clip_is_validated() -> None:
    with pytest.raises(ValueError, match="value_clip must be > 0 or None, got 0"):
        clipped_value_loss(
            torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), value_clip=0
        )
