"""Centring is exact: a batch that carries no signal gets advantages of exactly 0.

Group means in float32 leave rounding noise of order 1e-7 in ``s - mean`` even for a group of
equal scores; whitening (eps 1e-8) or a group-std division (eps 1e-6) then turns that noise into
advantages of order one. These tests hold every centring estimator, the whitening stage and the
running reward normalisation to the rule of ``lrft.algo._tensor.below_resolution``, and check
that on ordinary batches the results still equal the float64 formulas.
"""

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
    Advantages,
    RewardBatch,
    RunningMoments,
    compute_advantages,
    normalize_advantages,
)
from lrft.algo._tensor import resolution
from tests.unit.algo._strategies import FAST, GARBAGE, finite, grouped, masks, right_padded_masks

# (estimator, params): every built-in estimator that subtracts a group mean.
CENTRING = [
    ("rloo", AdvantageParams()),
    ("reinforce_baseline", AdvantageParams()),
    ("group_norm", AdvantageParams()),
    ("dr_grpo", AdvantageParams()),
    ("cpgd", AdvantageParams(cpgd_weight="std")),
    ("cpgd", AdvantageParams(cpgd_weight="equal")),
]
CENTRING_IDS = [f"{name}-{params.cpgd_weight}" for name, params in CENTRING]
WHITENED = {"reinforce_baseline"}
DTYPES = [torch.float32, torch.float64]

# Any magnitude a reward may have, including values no binary float holds exactly.
magnitudes = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


def _batch(scores: Tensor, mask: Tensor, group_ids: Tensor) -> RewardBatch:
    return RewardBatch.from_sequence_rewards(scores, mask, group_ids=group_ids)


def test_the_float32_reproduction_gives_exactly_zero() -> None:
    # Two groups of eight equal float32 scores. Before exact centring the float32 group means
    # were 1 ulp off: reinforce_baseline gave +-0.85 after whitening, group_norm 0.11, cpgd 0.11.
    scores = torch.tensor([1.1618950366973877] * 8 + [-0.774596631526947] * 8)
    batch = RewardBatch.from_sequence_rewards(
        scores, torch.ones(16, 3, dtype=torch.bool), group_size=8
    )
    for name, params in CENTRING:
        advantages = compute_advantages(name, batch, params).advantages
        assert advantages.dtype == torch.float32
        assert torch.equal(advantages, torch.zeros_like(advantages)), name


@pytest.mark.parametrize(("name", "params"), CENTRING, ids=CENTRING_IDS)
@FAST
@given(data=st.data(), group_ids=grouped(max_groups=5, max_size=9))
def test_a_batch_of_constant_groups_gives_exactly_zero(
    name: str, params: AdvantageParams, data: st.DataObject, group_ids: Tensor
) -> None:
    dtype = data.draw(st.sampled_from(DTYPES))
    labels = sorted(set(group_ids.tolist()))
    value = dict(
        zip(
            labels,
            data.draw(st.lists(magnitudes, min_size=len(labels), max_size=len(labels))),
            strict=True,
        )
    )
    scores = torch.tensor([value[g] for g in group_ids.tolist()], dtype=dtype)
    mask = data.draw(right_padded_masks(len(group_ids), 4))
    batch = _batch(scores, mask, group_ids)
    # Also as one of two data-parallel ranks with the same share: the merged statistics of
    # two all-zero shares are those of zeros again.
    for reduce in (None, lambda local: RunningMoments.merge_all([local, local])):
        advantages = compute_advantages(name, batch, params, reduce_moments=reduce).advantages
        assert torch.equal(advantages, torch.zeros_like(advantages)), (scores, advantages)


@FAST
@given(st.data(), st.integers(1, 5), st.integers(1, 5), magnitudes)
def test_whitening_values_that_are_all_equal_gives_exactly_zero(
    data: st.DataObject, rows: int, cols: int, value: float
) -> None:
    dtype = data.draw(st.sampled_from(DTYPES))
    mask = data.draw(masks(rows, cols))
    garbage = data.draw(st.sampled_from(GARBAGE))
    raw = torch.where(mask, torch.tensor(value, dtype=dtype), torch.tensor(garbage, dtype=dtype))
    out = normalize_advantages(
        Advantages(advantages=raw, returns=torch.zeros_like(raw), action_mask=mask), whiten=True
    )
    assert torch.equal(out.advantages, torch.zeros_like(raw))
    # reinforce++ at gamma 1 sees every token of every response return the same score
    batch = RewardBatch.from_sequence_rewards(
        torch.full((rows,), value, dtype=dtype), torch.ones(rows, cols, dtype=torch.bool)
    )
    advantages = compute_advantages("reinforce++", batch).advantages
    assert torch.equal(advantages, torch.zeros_like(advantages))


def test_spread_at_the_resolution_is_noise_and_above_it_is_signal() -> None:
    # float32 at 1.0: eps 2^-23, resolution 4 eps. A group one ulp apart is at rounding level and
    # gets no advantage (GRPO would have divided 6e-8 by 1e-6 + 8e-8: about +-0.05); a group 64
    # ulps apart (spread 32 eps > 4 eps) is signal and keeps GRPO's formula.
    ulp = torch.finfo(torch.float32).eps
    mask = torch.ones(2, 1, dtype=torch.bool)
    for gap, expected in ((ulp, 0.0), (64 * ulp, (32 * ulp) / (math.sqrt(2) * 32 * ulp + 1e-6))):
        scores = torch.tensor([1.0, 1.0 + gap], dtype=torch.float32)
        batch = RewardBatch.from_sequence_rewards(scores, mask, group_size=2)
        got = compute_advantages("group_norm", batch).advantages[:, 0].tolist()
        assert got == pytest.approx([-expected, expected], rel=1e-6)
    # the whitening stage (eps 1e-8): values 1 ulp apart whiten to 0; 64 ulps apart to
    # +-(gap / 2) / (gap / sqrt 2 + eps), the Bessel std of two values being gap / sqrt 2
    gap = 64 * ulp
    for spread, expected in ((ulp, 0.0), (gap, (gap / 2) / (gap / math.sqrt(2) + 1e-8))):
        raw = torch.tensor([[1.0], [1.0 + spread]], dtype=torch.float32)
        out = normalize_advantages(
            Advantages(advantages=raw, returns=raw, action_mask=mask), whiten=True
        )
        assert out.advantages[:, 0].tolist() == pytest.approx([-expected, expected], rel=1e-6)


def _reference(
    name: str, params: AdvantageParams, scores: list[float], ids: list[int], lengths: list[int]
) -> list[float]:
    """Each response's advantage by the estimator's formula in Python floats (double
    precision), with the documented rule: a group (or, for whitening, a batch of tokens) whose
    population std is at most ``resolution(float32) * |mean|`` counts as constant."""
    limit = resolution(torch.float32)
    out = []
    for i, s in enumerate(scores):
        group = [scores[j] for j in range(len(ids)) if ids[j] == ids[i]]
        others = [scores[j] for j in range(len(ids)) if ids[j] == ids[i] and j != i]
        mean = statistics.fmean(group)
        if statistics.pstdev(group) <= limit * abs(mean):
            out.append(0.0)
        elif name == "rloo":
            out.append(s - statistics.fmean(others))
        elif name == "group_norm":
            out.append((s - mean) / (statistics.stdev(group) + params.group_std_eps))
        elif name == "cpgd" and params.cpgd_weight == "std":
            out.append((s - mean) / (statistics.pstdev(group) + params.group_std_eps))
        else:
            out.append(s - mean)
    if name not in WHITENED:
        return out
    # whitening runs over tokens: each response's advantage once per valid token, as float32
    as_float32 = [float(torch.tensor(a, dtype=torch.float32)) for a in out]
    tokens = [a for a, n in zip(as_float32, lengths, strict=True) for _ in range(n)]
    mean = statistics.fmean(tokens)
    if statistics.pstdev(tokens) <= limit * abs(mean):
        return [0.0] * len(out)
    std = statistics.stdev(tokens)
    return [(a - mean) / (std + 1e-8) for a in as_float32]


@pytest.mark.parametrize(("name", "params"), CENTRING, ids=CENTRING_IDS)
@FAST
@given(data=st.data(), group_ids=grouped(max_groups=4, max_size=6))
def test_float32_batches_still_equal_the_float64_formula(
    name: str, params: AdvantageParams, data: st.DataObject, group_ids: Tensor
) -> None:
    values = data.draw(st.lists(finite, min_size=len(group_ids), max_size=len(group_ids)))
    scores = torch.tensor(values, dtype=torch.float32)
    mask = data.draw(right_padded_masks(len(group_ids), 4))
    lengths = mask.sum(-1).tolist()
    result = compute_advantages(name, _batch(scores, mask, group_ids), params).advantages
    got = [float(result[i, 0]) for i in range(len(values))]
    expected = _reference(name, params, scores.double().tolist(), group_ids.tolist(), lengths)
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-5)


@FAST
@given(st.integers(1, 20), magnitudes)
def test_running_moments_of_equal_values_are_exact(count: int, value: float) -> None:
    values = torch.full((count,), value, dtype=torch.float64)
    moments = RunningMoments.from_values(values)
    assert (moments.mean, moments.m2) == (value, 0.0)
    merged = moments.merge(RunningMoments.from_values(values))
    assert (merged.mean, merged.m2) == (value, 0.0)
    # the reward normaliser: nothing to scale by, so centred rewards are 0 and uncentred ones
    # are left as they are (dividing by eps alone would multiply them by 1e8)
    assert torch.equal(merged.normalize(values), torch.zeros_like(values))
    assert torch.equal(merged.normalize(values, subtract_mean=False), values)


def test_normalised_rewards_of_constant_groups_give_exactly_zero() -> None:
    # What --normalize_reward feeds the estimators: float64 running normalisation, then float32.
    # Binary rewards, one prompt solved by every sample and two by none: the normalised scores
    # (1.38, -0.69) were ones whose float32 group means came out an ulp off.
    raw = torch.tensor([1.0] * 8 + [0.0] * 8 + [0.0] * 8, dtype=torch.float64)
    moments = RunningMoments.from_values(raw)
    scores = moments.normalize(raw).float()
    batch = RewardBatch.from_sequence_rewards(
        scores, torch.ones(24, 2, dtype=torch.bool), group_size=8
    )
    for name, params in CENTRING:
        advantages = compute_advantages(name, batch, params).advantages
        assert torch.equal(advantages, torch.zeros_like(advantages)), name
