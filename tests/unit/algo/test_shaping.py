"""DAPO dynamic sampling filter and overlong buffer; FIRE first-token temperature."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from lrft.algo import dynamic_sampling_filter, fire_temperatures, overlong_penalty, scale_logits
from tests.unit.algo._strategies import FAST, grouped, masks


def test_dynamic_sampling_filter_by_hand() -> None:
    # Groups of 2: [1, 1] all correct -> drop; [0, 1] -> keep; [0, 0] -> drop; [0.5, 1] -> keep.
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 1.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    result = dynamic_sampling_filter(rewards, groups)
    assert result.keep.tolist() == [False, False, True, True, False, False, True, True]
    assert (result.kept_groups, result.dropped_groups) == (2, 2)
    # with a tolerance of 0.5 the [0.5, 1] group counts as constant too
    assert dynamic_sampling_filter(rewards, groups, atol=0.5).kept_groups == 1


@FAST
@given(st.data(), grouped())
def test_filter_keeps_exactly_the_groups_with_a_reward_spread(
    data: st.DataObject, group_ids: Tensor
) -> None:
    rewards = data.draw(
        st.lists(st.sampled_from([0.0, 1.0]), min_size=len(group_ids), max_size=len(group_ids))
    )
    result = dynamic_sampling_filter(torch.tensor(rewards), group_ids)
    ids = group_ids.tolist()
    for i, keep in enumerate(result.keep.tolist()):
        members = {rewards[j] for j in range(len(ids)) if ids[j] == ids[i]}
        assert keep == (len(members) > 1)
    assert result.kept_groups + result.dropped_groups == len(set(ids))


def test_overlong_penalty_at_its_boundaries() -> None:
    # max_len 20, buffer 5, factor 2: no penalty up to 15 tokens, then -2 * (len - 15) / 5,
    # reaching -2 at 20; beyond the limit it stays -2.
    lengths = torch.tensor([0, 15, 16, 18, 20, 25])
    got = overlong_penalty(lengths, max_len=20, buffer_len=5, penalty_factor=2.0)
    torch.testing.assert_close(got, torch.tensor([0.0, 0.0, -0.4, -1.2, -2.0, -2.0]))


@FAST
@given(st.integers(1, 64), st.data(), st.floats(0.0, 3.0))
def test_overlong_penalty_is_a_non_increasing_ramp(
    max_len: int, data: st.DataObject, factor: float
) -> None:
    buffer = data.draw(st.integers(1, max_len))
    lengths = torch.arange(0, max_len + 3)
    penalty = overlong_penalty(lengths, max_len=max_len, buffer_len=buffer, penalty_factor=factor)
    assert bool((penalty[1:] <= penalty[:-1] + 1e-7).all())
    assert bool((penalty <= 0).all())
    assert bool((penalty >= -factor - 1e-6).all())
    assert penalty[max_len - buffer].item() == 0.0
    assert penalty[max_len].item() == pytest.approx(-factor)


def test_overlong_penalty_validation() -> None:
    with pytest.raises(ValueError, match=r"buffer_len must be in \[1, max_len=10\], got 11"):
        overlong_penalty(torch.tensor([3]), max_len=10, buffer_len=11)


def test_fire_temperatures_by_hand() -> None:
    # The first *valid* position of each row is the first generated token.
    mask = torch.tensor([[1, 1, 1], [0, 1, 1], [0, 0, 0]])
    got = fire_temperatures(mask, first_token_temperature=10.0, temperature=0.7)
    torch.testing.assert_close(
        got, torch.tensor([[10.0, 0.7, 0.7], [0.7, 10.0, 0.7], [0.7, 0.7, 0.7]])
    )


@FAST
@given(st.data(), st.integers(1, 4), st.integers(1, 6))
def test_exactly_one_first_token_per_nonempty_row(
    data: st.DataObject, rows: int, cols: int
) -> None:
    mask = data.draw(masks(rows, cols))
    temps = fire_temperatures(mask, first_token_temperature=3.0, temperature=1.0)
    hot = temps == 3.0
    assert hot.sum(dim=-1).tolist() == [int(bool(row.any())) for row in mask]
    for i in range(rows):
        if mask[i].any():
            assert int(hot[i].nonzero()[0]) == int(mask[i].nonzero()[0])


def test_scale_logits_divides_each_position() -> None:
    logits = torch.tensor([[[2.0, 4.0], [3.0, 6.0]]])
    temps = torch.tensor([[2.0, 0.5]])
    torch.testing.assert_close(
        scale_logits(logits, temps), torch.tensor([[[1.0, 2.0], [6.0, 12.0]]])
    )
    with pytest.raises(ValueError, match="temperatures must be > 0"):
        fire_temperatures(torch.ones(1, 1), first_token_temperature=0.0, temperature=1.0)
