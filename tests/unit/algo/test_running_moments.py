"""Mergeable running statistics: merging shards equals the statistics of the concatenation."""

from __future__ import annotations

import statistics

import attrs
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lrft.algo import RunningMoments
from tests.unit.algo._strategies import FAST

samples = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False)


def test_by_hand() -> None:
    # [1, 2, 3, 4]: mean 2.5, squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5
    moments = RunningMoments.from_values(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    assert (moments.count, moments.mean, moments.m2) == (4, 2.5, 5.0)
    assert moments.variance == pytest.approx(1.25)
    assert moments.sample_variance == pytest.approx(5 / 3)
    # merge [1, 2] (mean 1.5, m2 0.5) with [3, 4] (mean 3.5, m2 0.5):
    # delta 2, mean 1.5 + 2 * 2/4 = 2.5, m2 0.5 + 0.5 + 4 * 2 * 2 / 4 = 5
    merged = RunningMoments.from_values(torch.tensor([1.0, 2.0])).merge(
        RunningMoments.from_values(torch.tensor([3.0, 4.0]))
    )
    assert (merged.count, merged.mean, merged.m2) == (4, 2.5, 5.0)


@FAST
@given(st.lists(st.lists(samples, max_size=12), min_size=1, max_size=5))
def test_merging_shards_equals_the_statistics_of_the_concatenation(
    shards: list[list[float]],
) -> None:
    parts = [RunningMoments.from_values(torch.tensor(s, dtype=torch.float64)) for s in shards]
    merged = RunningMoments.merge_all(parts)
    pooled = [x for s in shards for x in s]
    assert merged.count == len(pooled)
    if pooled:
        assert merged.mean == pytest.approx(statistics.fmean(pooled), rel=1e-9, abs=1e-9)
        assert merged.variance == pytest.approx(statistics.pvariance(pooled), rel=1e-9, abs=1e-6)
    if len(pooled) > 1:
        assert merged.sample_variance == pytest.approx(
            statistics.variance(pooled), rel=1e-9, abs=1e-6
        )
    # a stream of updates is the same as one merge
    streamed = RunningMoments()
    for s in shards:
        streamed = streamed.update(torch.tensor(s, dtype=torch.float64))
    assert streamed.count == merged.count
    assert streamed.mean == pytest.approx(merged.mean, rel=1e-12, abs=1e-12)
    assert streamed.m2 == pytest.approx(merged.m2, rel=1e-9, abs=1e-6)


def test_empty_statistics_are_the_identity() -> None:
    moments = RunningMoments.from_values(torch.tensor([2.0, 5.0]))
    assert RunningMoments().merge(moments) == moments
    assert moments.merge(RunningMoments.from_values(torch.tensor([]))) == moments


def test_packing_round_trips_for_collectives_and_checkpoints() -> None:
    moments = RunningMoments.from_values(torch.tensor([0.5, 1.5, 7.0]))
    assert RunningMoments.from_tensor(moments.to_tensor()) == moments
    assert RunningMoments(**attrs.asdict(moments)) == moments


def test_normalize_by_hand() -> None:
    # stats of [1, 3]: mean 2, sample std sqrt(2); 4 -> (4 - 2) / sqrt(2) = sqrt(2)
    moments = RunningMoments.from_values(torch.tensor([1.0, 3.0], dtype=torch.float64))
    got = moments.normalize(torch.tensor([4.0], dtype=torch.float64), eps=0.0)
    assert got.item() == pytest.approx(2**0.5)
    unc = moments.normalize(torch.tensor([4.0], dtype=torch.float64), subtract_mean=False, eps=0.0)
    assert unc.item() == pytest.approx(4 / 2**0.5)
    with pytest.raises(ValueError, match="empty statistics"):
        RunningMoments().normalize(torch.tensor([1.0]))
