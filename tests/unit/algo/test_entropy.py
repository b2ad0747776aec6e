"""Token entropy, the entropy bonus and high-entropy token selection."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lrft.algo import entropy_bonus, entropy_from_logits, high_entropy_token_mask
from tests.unit.algo._strategies import FAST, masks, matrices


@FAST
@given(st.integers(0, 2**31 - 1), st.integers(1, 3), st.integers(1, 4), st.integers(1, 6))
def test_entropy_equals_minus_sum_p_log_p(seed: int, rows: int, cols: int, vocab: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, cols, vocab, generator=generator, dtype=torch.float64) * 3
    mask = torch.rand(rows, cols, generator=generator) < 0.7
    got = entropy_from_logits(logits, mask)
    for i in range(rows):
        for t in range(cols):
            if not mask[i, t]:
                assert got[i, t].item() == 0.0
                continue
            z = logits[i, t].tolist()
            top = max(z)
            weights = [math.exp(v - top) for v in z]
            total = sum(weights)
            expected = -sum(w / total * math.log(w / total) for w in weights)
            assert got[i, t].item() == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_entropy_by_hand() -> None:
    # uniform over 4 -> log 4; a near one-hot -> ~0; [0, 0, -inf] is uniform over 2 -> log 2.
    logits = torch.tensor(
        [[[1.0, 1.0, 1.0, 1.0], [60.0, 0.0, 0.0, 0.0], [0.0, 0.0, -math.inf, -math.inf]]],
        requires_grad=True,
    )
    mask = torch.ones(1, 3, dtype=torch.bool)
    entropy = entropy_from_logits(logits, mask)
    torch.testing.assert_close(
        entropy, torch.tensor([[math.log(4.0), 0.0, math.log(2.0)]]), atol=1e-6, rtol=0
    )
    (grad,) = torch.autograd.grad(entropy.sum(), logits)
    assert bool(torch.isfinite(grad).all())


def test_entropy_bonus_is_the_aggregated_entropy() -> None:
    # Row 0: uniform over 2 (log 2) and uniform over 2; row 1: one token uniform over 2, one padded.
    logits = torch.zeros(2, 2, 2)
    mask = torch.tensor([[1, 1], [1, 0]])
    assert entropy_bonus(logits, mask).item() == pytest.approx(math.log(2.0))
    assert entropy_bonus(logits, mask, aggregation="seq-mean-token-sum").item() == pytest.approx(
        (2 * math.log(2.0) + math.log(2.0)) / 2
    )


def test_high_entropy_selection_by_hand() -> None:
    # 5 valid tokens, top 40% -> ceil(2.0) = 2 tokens: entropies 0.9 and 0.7 (5.0 is padding).
    entropy = torch.tensor([[0.1, 0.9, 0.5], [0.7, 0.2, 5.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    got = high_entropy_token_mask(entropy, mask, 0.4)
    assert got.tolist() == [[False, True, False], [True, False, False]]
    # 0.1 * 30 valid tokens is 3 (not 4, as a naive ceil of 3.0000000000000004 would give)
    assert int(high_entropy_token_mask(torch.rand(3, 10), torch.ones(3, 10), 0.1).sum()) == 3


@FAST
@given(st.data(), st.integers(1, 4), st.integers(1, 6), st.floats(0.01, 1.0))
def test_high_entropy_selection_keeps_the_top_fraction_of_valid_tokens(
    data: st.DataObject, rows: int, cols: int, fraction: float
) -> None:
    entropy = data.draw(
        matrices(rows, cols, st.sampled_from([0.0, 0.5, 1.0, 2.0]) | st.floats(0, 5))
    )
    mask = data.draw(masks(rows, cols))
    selected = high_entropy_token_mask(entropy, mask, fraction)
    valid = int(mask.sum())
    assert int(selected.sum()) == min(valid, math.ceil(round(fraction * valid, 9)))
    assert not bool((selected & ~mask).any())
    chosen = entropy[selected]
    left = entropy[mask & ~selected]
    if chosen.numel() and left.numel():
        assert float(chosen.min()) >= float(left.max())


def test_top_fraction_is_validated() -> None:
    with pytest.raises(ValueError, match=r"top_fraction must be in \(0, 1\], got 0.0"):
        high_entropy_token_mask(torch.zeros(1, 1), torch.ones(1, 1), 0.0)
