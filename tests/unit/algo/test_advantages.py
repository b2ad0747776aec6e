"""Advantage estimators against hand-computed values and their defining formulas."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from lrft.algo import (
    AdvantageParams,
    RewardBatch,
    advantage_estimators,
    cpgd,
    discounted_returns,
    dr_grpo,
    gae,
    gae_advantages,
    group_norm,
    reinforce,
    reinforce_baseline,
    reinforce_plus_plus,
    rloo,
)
from tests.unit.algo._strategies import FAST, finite, grouped, masks, matrices, valid_rows

rewards_with_ties = st.one_of(finite, st.sampled_from([0.0, 1.0]))


def _naive_gae(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lambd: float
) -> tuple[list[list[float]], list[list[float]]]:
    """The direct-sum definition: A_k = sum_{j>=k} (gamma lambda)^(j-k) delta_j, V after end = 0."""
    advantages, returns = [], []
    for r, v in zip(valid_rows(rewards, mask), valid_rows(values, mask), strict=True):
        length = len(r)
        row_adv = []
        for k in range(length):
            total = 0.0
            for j in range(k, length):
                next_value = v[j + 1] if j + 1 < length else 0.0
                delta = r[j] + gamma * next_value - v[j]
                total += (gamma * lambd) ** (j - k) * delta
            row_adv.append(total)
        advantages.append(row_adv)
        returns.append([a + value for a, value in zip(row_adv, v, strict=True)])
    return advantages, returns


def _scores(rewards: list[float]) -> Tensor:
    return torch.tensor(rewards, dtype=torch.float64)


def _outcome_batch(scores: Tensor, group_ids: Tensor) -> RewardBatch:
    mask = torch.ones(scores.shape[0], 3, dtype=torch.bool)
    mask[0, 2] = False  # ragged: the advantage must still fill exactly the valid tokens
    return RewardBatch.from_sequence_rewards(scores, mask, group_ids=group_ids)


def test_gae_by_hand_with_a_hole_and_garbage_in_it() -> None:
    # rewards [0, 0, 1], values [0.5, 0.6, 0.7], gamma 0.9, lambda 0.8 (gamma*lambda = 0.72):
    # delta2 = 1 - 0.7 = 0.3; delta1 = 0.9*0.7 - 0.6 = 0.03; delta0 = 0.9*0.6 - 0.5 = 0.04
    # A2 = 0.3; A1 = 0.03 + 0.72*0.3 = 0.246; A0 = 0.04 + 0.72*0.246 = 0.21712
    # returns = A + V = [0.71712, 0.846, 1.0]. Position 1 is a hole: it is skipped entirely.
    rewards = torch.tensor([[0.0, 99.0, 0.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, -42.0, 0.6, 0.7]], dtype=torch.float64)
    mask = torch.tensor([[True, False, True, True]])
    advantages, returns = gae_advantages(rewards, values, mask, gamma=0.9, lambd=0.8)
    torch.testing.assert_close(
        advantages, torch.tensor([[0.21712, 0.0, 0.246, 0.3]], dtype=torch.float64)
    )
    torch.testing.assert_close(
        returns, torch.tensor([[0.71712, 0.0, 0.846, 1.0]], dtype=torch.float64)
    )


@FAST
@given(st.data(), st.integers(1, 4), st.integers(1, 6), st.floats(0, 1), st.floats(0, 1))
def test_gae_equals_its_direct_sum_definition(
    data: st.DataObject, rows: int, cols: int, gamma: float, lambd: float
) -> None:
    rewards = data.draw(matrices(rows, cols))
    values = data.draw(matrices(rows, cols))
    mask = data.draw(masks(rows, cols))
    batch = RewardBatch(token_rewards=rewards, action_mask=mask, values=values)
    result = gae(batch, AdvantageParams(gamma=gamma, lambd=lambd))
    expected_adv, expected_ret = _naive_gae(rewards, values, mask, gamma, lambd)
    for got, want in ((result.advantages, expected_adv), (result.returns, expected_ret)):
        for row_got, row_want in zip(valid_rows(got, mask), want, strict=True):
            assert row_got == pytest.approx(row_want, rel=1e-9, abs=1e-9)
        assert bool((got[~mask] == 0).all())


def test_gae_with_lambda_one_is_return_minus_value() -> None:
    # lambda = 1 telescopes GAE to the Monte-Carlo advantage G_t - V_t: with gamma 0.5 and
    # rewards [1, 2], G = [1 + 0.5*2, 2] = [2, 2]; values [0.25, 1] give A = [1.75, 1].
    rewards = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
    values = torch.tensor([[0.25, 1.0]], dtype=torch.float64)
    advantages, returns = gae_advantages(
        rewards, values, torch.ones(1, 2, dtype=torch.bool), gamma=0.5, lambd=1.0
    )
    torch.testing.assert_close(advantages, torch.tensor([[1.75, 1.0]], dtype=torch.float64))
    torch.testing.assert_close(returns, torch.tensor([[2.0, 2.0]], dtype=torch.float64))


def test_reinforce_by_hand() -> None:
    # rewards [0, 0, 1] with gamma 0.5: G = [0.25, 0.5, 1]; the padded position stays 0.
    batch = RewardBatch.from_sequence_rewards(
        torch.tensor([1.0], dtype=torch.float64), torch.tensor([[True, True, True, False]])
    )
    result = reinforce(batch, AdvantageParams(gamma=0.5))
    expected = torch.tensor([[0.25, 0.5, 1.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(result.advantages, expected)
    torch.testing.assert_close(result.returns, expected)


@FAST
@given(st.data(), st.integers(1, 4), st.integers(1, 6), st.floats(0, 1))
def test_discounted_returns_equal_the_reward_to_go(
    data: st.DataObject, rows: int, cols: int, gamma: float
) -> None:
    rewards = data.draw(matrices(rows, cols))
    mask = data.draw(masks(rows, cols))
    got = discounted_returns(rewards, mask, gamma)
    for row_got, r in zip(valid_rows(got, mask), valid_rows(rewards, mask), strict=True):
        want = [sum(gamma ** (j - k) * r[j] for j in range(k, len(r))) for k in range(len(r))]
        assert row_got == pytest.approx(want, rel=1e-9, abs=1e-9)


@FAST
@given(st.data(), st.integers(1, 4), st.integers(1, 5))
def test_reinforce_plus_plus_raw_output_is_plain_reinforce(
    data: st.DataObject, rows: int, cols: int
) -> None:
    # The two differ only in the declared whitening; the estimator itself never normalises.
    batch = RewardBatch(
        token_rewards=data.draw(matrices(rows, cols)), action_mask=data.draw(masks(rows, cols))
    )
    params = AdvantageParams(gamma=0.9)
    plus = reinforce_plus_plus(batch, params)
    plain = reinforce(batch, params)
    assert torch.equal(plus.advantages, plain.advantages)
    assert not plus.normalized
    assert advantage_estimators.get("reinforce++").whiten
    assert not advantage_estimators.get("reinforce").whiten


def test_group_norm_by_hand() -> None:
    # Group 7: rewards [1, 0, 1, 0], mean 0.5, Bessel std sqrt(4 * 0.25 / 3) = sqrt(1/3);
    # A = +-0.5 / sqrt(1/3) = +-0.8660254 (eps 1e-6 shifts the 7th digit). Group 3: [2, 2] -> 0.
    scores = _scores([1.0, 0.0, 2.0, 1.0, 0.0, 2.0])
    groups = torch.tensor([7, 7, 3, 7, 7, 3])
    result = group_norm(_outcome_batch(scores, groups), AdvantageParams())
    first = result.advantages[:, 0]
    torch.testing.assert_close(
        first,
        torch.tensor([0.8660254, -0.8660254, 0.0, 0.8660254, -0.8660254, 0.0], dtype=torch.float64),
        atol=1e-5,
        rtol=0,
    )


@FAST
@given(st.data(), grouped())
def test_group_norm_has_zero_mean_and_unit_std_per_group(
    data: st.DataObject, group_ids: Tensor
) -> None:
    scores = data.draw(
        st.lists(rewards_with_ties, min_size=len(group_ids), max_size=len(group_ids))
    )
    result = group_norm(_outcome_batch(_scores(scores), group_ids), AdvantageParams())
    advantages = result.advantages[:, 0].tolist()
    for label in set(group_ids.tolist()):
        members = [i for i, g in enumerate(group_ids.tolist()) if g == label]
        group_adv = [advantages[i] for i in members]
        assert statistics.fmean(group_adv) == pytest.approx(0.0, abs=1e-9)
        raw_std = statistics.stdev([scores[i] for i in members])
        # unit std up to the eps in the divisor: std(A) = std / (std + eps), eps = 1e-6
        assert statistics.stdev(group_adv) == pytest.approx(raw_std / (raw_std + 1e-6), abs=1e-6)
        if raw_std > 1e-2:
            assert statistics.stdev(group_adv) == pytest.approx(1.0, rel=1e-4)


def test_rloo_by_hand() -> None:
    # Group [1, 0, 0]: A_0 = 1 - (0 + 0)/2 = 1; A_1 = A_2 = 0 - (1 + 0)/2 = -0.5.
    result = rloo(
        _outcome_batch(_scores([1.0, 0.0, 0.0]), torch.tensor([0, 0, 0])), AdvantageParams()
    )
    torch.testing.assert_close(
        result.advantages[:, 0], torch.tensor([1.0, -0.5, -0.5], dtype=torch.float64)
    )


@FAST
@given(st.data(), grouped())
def test_rloo_baseline_is_the_mean_of_the_others(data: st.DataObject, group_ids: Tensor) -> None:
    scores = data.draw(
        st.lists(rewards_with_ties, min_size=len(group_ids), max_size=len(group_ids))
    )
    result = rloo(_outcome_batch(_scores(scores), group_ids), AdvantageParams())
    ids = group_ids.tolist()
    for i, advantage in enumerate(result.advantages[:, 0].tolist()):
        others = [scores[j] for j in range(len(ids)) if ids[j] == ids[i] and j != i]
        assert advantage == pytest.approx(scores[i] - statistics.fmean(others), abs=1e-9)


@FAST
@given(st.data(), grouped())
def test_reinforce_baseline_and_dr_grpo_subtract_the_group_mean(
    data: st.DataObject, group_ids: Tensor
) -> None:
    scores = data.draw(
        st.lists(rewards_with_ties, min_size=len(group_ids), max_size=len(group_ids))
    )
    batch = _outcome_batch(_scores(scores), group_ids)
    ids = group_ids.tolist()
    expected = [
        scores[i] - statistics.fmean([scores[j] for j in range(len(ids)) if ids[j] == ids[i]])
        for i in range(len(ids))
    ]
    for estimator in (reinforce_baseline, dr_grpo):
        got = estimator(batch, AdvantageParams()).advantages[:, 0].tolist()
        assert got == pytest.approx(expected, abs=1e-9)


def test_cpgd_by_hand() -> None:
    # Group [1, 0, 0]: mean 1/3, centred [2/3, -1/3, -1/3]; population std
    # sqrt((4/9 + 1/9 + 1/9) / 3) = sqrt(2/9) = 0.4714045; A = [1.4142136, -0.7071068, -0.7071068].
    batch = _outcome_batch(_scores([1.0, 0.0, 0.0]), torch.tensor([5, 5, 5]))
    std_weighted = cpgd(batch, AdvantageParams())
    torch.testing.assert_close(
        std_weighted.advantages[:, 0],
        torch.tensor([1.4142136, -0.7071068, -0.7071068], dtype=torch.float64),
        atol=1e-5,
        rtol=0,
    )
    equal = cpgd(batch, AdvantageParams(cpgd_weight="equal"))
    torch.testing.assert_close(
        equal.advantages[:, 0], torch.tensor([2 / 3, -1 / 3, -1 / 3], dtype=torch.float64)
    )


@pytest.mark.parametrize("name", ["rloo", "reinforce_baseline", "group_norm", "dr_grpo", "cpgd"])
def test_outcome_advantages_fill_exactly_the_valid_tokens(name: str) -> None:
    mask = torch.tensor(
        [[True, True, False], [True, False, True], [True, True, True], [False, True, True]]
    )
    batch = RewardBatch.from_sequence_rewards(_scores([1.0, 0.0, 0.0, 3.0]), mask, group_size=2)
    result = advantage_estimators.get(name).fn(batch, AdvantageParams())
    for row in range(4):
        valid = result.advantages[row][mask[row]]
        assert bool((valid == valid[0]).all())
        assert bool((result.advantages[row][~mask[row]] == 0).all())
    torch.testing.assert_close(result.returns, result.advantages)


@pytest.mark.parametrize("name", ["rloo", "reinforce_baseline", "group_norm", "dr_grpo", "cpgd"])
def test_group_estimators_refuse_singleton_groups(name: str) -> None:
    batch = _outcome_batch(_scores([1.0, 0.0, 1.0]), torch.tensor([0, 0, 9]))
    with pytest.raises(ValueError, match=r"at least 2 responses per prompt; groups \[9\] have 1"):
        advantage_estimators.get(name).fn(batch, AdvantageParams())


def test_sequence_rewards_sit_on_the_last_valid_token() -> None:
    mask = torch.tensor([[True, True, False], [True, False, True]])
    batch = RewardBatch.from_sequence_rewards(torch.tensor([2.0, 3.0]), mask)
    torch.testing.assert_close(
        batch.token_rewards, torch.tensor([[0.0, 2.0, 0.0], [0.0, 0.0, 3.0]])
    )
    torch.testing.assert_close(batch.sequence_scores, torch.tensor([2.0, 3.0]))


def test_sequence_scores_ignore_rewards_on_padding() -> None:
    batch = RewardBatch(
        token_rewards=torch.tensor([[1.0, 2.0, math.nan]]), action_mask=torch.tensor([[1, 1, 0]])
    )
    torch.testing.assert_close(batch.sequence_scores, torch.tensor([3.0]))


def test_reward_batch_construction_errors_name_the_problem() -> None:
    mask = torch.ones(3, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="batch size 3 is not divisible by group_size 2"):
        RewardBatch.from_sequence_rewards(torch.zeros(3), mask, group_size=2)
    with pytest.raises(ValueError, match="not both"):
        RewardBatch.from_sequence_rewards(
            torch.zeros(3), mask, group_size=3, group_ids=torch.zeros(3, dtype=torch.long)
        )
    with pytest.raises(ValueError, match=r"rows \[1\] have no valid token"):
        RewardBatch.from_sequence_rewards(torch.zeros(3), torch.tensor([[1, 0], [0, 0], [1, 1]]))
    with pytest.raises(ValueError, match=r"values has shape \(3, 5\) but token_rewards has shape"):
        RewardBatch(token_rewards=torch.zeros(3, 2), action_mask=mask, values=torch.zeros(3, 5))
    with pytest.raises(ValueError, match="group_ids must be an integer tensor"):
        RewardBatch(token_rewards=torch.zeros(3, 2), action_mask=mask, group_ids=torch.zeros(3))
    with pytest.raises(ValueError, match="gae needs critic values"):
        gae(RewardBatch(token_rewards=torch.zeros(3, 2), action_mask=mask), AdvantageParams())
