"""Loss aggregation modes against their formulas on ragged masks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lrft.algo import AGGREGATION_MODES, aggregate_loss
from lrft.api.errors import ConfigError
from tests.unit.algo._strategies import FAST, masks, matrices, valid_rows


def test_each_mode_by_hand() -> None:
    # Row 0 valid [1, 2, 3], row 1 valid [4], row 2 empty (its 100 is padding).
    losses = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [100.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    # token-mean: (1 + 2 + 3 + 4) / 4 = 2.5
    assert aggregate_loss(losses, mask, "token-mean").item() == pytest.approx(2.5)
    # seq-mean-token-mean: (mean[1,2,3] + mean[4]) / 2 = (2 + 4) / 2 = 3; the empty row takes no part
    assert aggregate_loss(losses, mask, "seq-mean-token-mean").item() == pytest.approx(3.0)
    # seq-mean-token-sum: (6 + 4) / 2 = 5
    assert aggregate_loss(losses, mask, "seq-mean-token-sum").item() == pytest.approx(5.0)
    # seq-mean-token-sum-norm with max_len 10: (6 + 4) / 2 / 10 = 0.5
    got = aggregate_loss(losses, mask, "seq-mean-token-sum-norm", max_len=10)
    assert got.item() == pytest.approx(0.5)


def _formula(mode: str, rows: list[list[float]], max_len: int) -> float:
    nonempty = [r for r in rows if r]
    if not nonempty:
        return 0.0
    if mode == "token-mean":
        flat = [x for r in nonempty for x in r]
        return sum(flat) / len(flat)
    if mode == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in nonempty) / len(nonempty)
    if mode == "seq-mean-token-sum":
        return sum(sum(r) for r in nonempty) / len(nonempty)
    assert mode == "seq-mean-token-sum-norm"
    return sum(sum(r) for r in nonempty) / len(nonempty) / max_len


@FAST
@given(st.data(), st.integers(1, 5), st.integers(1, 6), st.sampled_from(AGGREGATION_MODES))
def test_each_mode_equals_its_formula_on_ragged_masks(
    data: st.DataObject, rows: int, cols: int, mode: str
) -> None:
    losses = data.draw(matrices(rows, cols))
    mask = data.draw(masks(rows, cols))
    got = aggregate_loss(losses, mask, mode, max_len=16)  # type: ignore[arg-type]
    assert got.item() == pytest.approx(_formula(mode, valid_rows(losses, mask), 16), abs=1e-12)


def test_an_all_padding_batch_gives_zero_with_a_gradient_path() -> None:
    losses = torch.ones(2, 3, requires_grad=True)
    for mode in AGGREGATION_MODES:
        out = aggregate_loss(losses, torch.zeros(2, 3, dtype=torch.bool), mode, max_len=4)  # type: ignore[arg-type]
        assert out.item() == 0.0
        (grad,) = torch.autograd.grad(out, losses)
        assert bool((grad == 0).all())


def test_token_sum_norm_divides_by_the_constant_not_the_batch_width() -> None:
    # Same single response, padded to widths 2 and 5: the loss must not change with padding.
    narrow = aggregate_loss(
        torch.tensor([[3.0, 0.0]]), torch.tensor([[1, 0]]), "seq-mean-token-sum-norm", max_len=8
    )
    wide = aggregate_loss(
        torch.tensor([[3.0, 0, 0, 0, 0]]),
        torch.tensor([[1, 0, 0, 0, 0]]),
        "seq-mean-token-sum-norm",
        max_len=8,
    )
    assert narrow.item() == wide.item() == pytest.approx(3.0 / 8)


def test_errors_name_the_mode_and_rule() -> None:
    with pytest.raises(ConfigError, match="unknown aggregation mode 'mean'; known: 'token-mean'"):
        aggregate_loss(torch.zeros(1, 1), torch.ones(1, 1), "mean")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="needs a positive constant max_len, got None"):
        aggregate_loss(torch.zeros(1, 1), torch.ones(1, 1), "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match=r"action_mask has shape \(1, 2\) but token_losses"):
        aggregate_loss(torch.zeros(1, 1), torch.ones(1, 2), "token-mean")
