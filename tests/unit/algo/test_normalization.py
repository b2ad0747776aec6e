"""The single normalisation stage: whitening happens exactly once, where the estimator says."""

from __future__ import annotations

import statistics

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lrft.algo import (
    AdvantageParams,
    Advantages,
    PolicyLossConfig,
    PolicyLossInputs,
    RewardBatch,
    RunningMoments,
    advantage_estimators,
    advantage_moments,
    compute_advantages,
    normalize_advantages,
    policy_losses,
)
from lrft.algo import normalization as normalization_module
from tests.unit.algo._strategies import FAST, masks, matrices, valid_rows


def _batch(rows: int = 4, cols: int = 3) -> RewardBatch:
    generator = torch.Generator().manual_seed(0)
    mask = torch.ones(rows, cols, dtype=torch.bool)
    mask[1, 2] = False
    return RewardBatch(
        token_rewards=torch.rand(rows, cols, generator=generator, dtype=torch.float64) * 3,
        action_mask=mask,
        group_ids=torch.arange(rows) // 2,
        values=torch.rand(rows, cols, generator=generator, dtype=torch.float64),
        # what the distillation estimators read: the student's and a teacher's logprobs
        logprobs=-torch.rand(rows, cols, generator=generator, dtype=torch.float64) * 2,
        teacher_logprobs=-torch.rand(rows, cols, generator=generator, dtype=torch.float64) * 2,
    )


def _whiten_once(raw: Advantages) -> list[list[float]]:
    """Whitening written out with the statistics module: (a - mean) / (stdev + 1e-8)."""
    flat = [a for row in valid_rows(raw.advantages, raw.action_mask) for a in row]
    mean, std = statistics.fmean(flat), statistics.stdev(flat)
    return [
        [(a - mean) / (std + 1e-8) for a in row]
        for row in valid_rows(raw.advantages, raw.action_mask)
    ]


@pytest.mark.parametrize("name", sorted(advantage_estimators.names()))
def test_each_estimator_is_normalised_exactly_as_it_declares(name: str) -> None:
    spec = advantage_estimators.get(name)
    batch = _batch()
    raw = spec.fn(batch, AdvantageParams(gamma=0.9, lambd=0.95))
    assert not raw.normalized  # estimators return raw advantages, never whitened ones
    final = compute_advantages(name, batch, AdvantageParams(gamma=0.9, lambd=0.95))
    assert final.normalized
    got = valid_rows(final.advantages, final.action_mask)
    raw_rows = valid_rows(raw.advantages, raw.action_mask)
    expected = _whiten_once(raw) if spec.whiten else raw_rows
    for row_got, row_want in zip(got, expected, strict=True):
        assert row_got == pytest.approx(row_want, rel=1e-9, abs=1e-9)
    # returns are the critic's target and are never rescaled
    torch.testing.assert_close(final.returns, raw.returns)


@pytest.mark.parametrize("name", sorted(advantage_estimators.names()))
def test_compute_advantages_runs_the_stage_once(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []
    real = normalization_module.normalize_advantages

    def spy(result: Advantages, **kwargs: object) -> Advantages:
        calls.append(bool(kwargs["whiten"]))
        return real(result, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(normalization_module, "normalize_advantages", spy)
    compute_advantages(name, _batch())
    assert calls == [advantage_estimators.get(name).whiten]


def test_the_stage_refuses_to_run_twice() -> None:
    once = compute_advantages("reinforce++", _batch())
    with pytest.raises(
        ValueError, match="already normalised; the normalisation stage runs exactly once"
    ):
        normalize_advantages(once, whiten=True)
    with pytest.raises(ValueError, match="already normalised"):
        normalize_advantages(once, whiten=False)


def test_an_estimator_that_returns_normalised_advantages_is_rejected() -> None:
    from lrft.algo import register_advantage_estimator

    def cheating(batch: RewardBatch, params: AdvantageParams) -> Advantages:
        zeros = torch.zeros_like(batch.token_rewards)
        return Advantages(
            advantages=zeros, returns=zeros, action_mask=batch.action_mask, normalized=True
        )

    register_advantage_estimator("test_cheating", cheating, whiten=False)
    try:
        with pytest.raises(ValueError, match="returned advantages marked normalised"):
            compute_advantages("test_cheating", _batch())
    finally:
        advantage_estimators.remove("test_cheating")


@FAST
@given(st.data(), st.integers(1, 4), st.integers(1, 5))
def test_whitened_advantages_have_zero_mean_and_unit_std(
    data: st.DataObject, rows: int, cols: int
) -> None:
    mask = data.draw(masks(rows, cols))
    raw = Advantages(
        advantages=data.draw(matrices(rows, cols)),
        returns=torch.zeros(rows, cols),
        action_mask=mask,
    )
    out = normalize_advantages(raw, whiten=True)
    flat_raw = [a for row in valid_rows(raw.advantages, mask) for a in row]
    flat = [a for row in valid_rows(out.advantages, mask) for a in row]
    assert bool((out.advantages[~mask] == 0).all())
    if len(flat) >= 2 and statistics.stdev(flat_raw) > 1e-3:
        assert statistics.fmean(flat) == pytest.approx(0.0, abs=1e-9)
        assert statistics.stdev(flat) == pytest.approx(1.0, rel=1e-6)


def test_shards_whitened_with_merged_moments_equal_the_whole_batch() -> None:
    # Two data-parallel ranks: each whitens its shard with the merged statistics of both, which
    # must give what one process whitening the concatenated batch gets.
    whole = _batch(rows=8)
    halves = [
        RewardBatch.from_token_rewards(
            whole.token_rewards[s],
            whole.action_mask[s],
            group_size=2,
            values=whole.values[s],  # type: ignore[index]
        )
        for s in (slice(0, 4), slice(4, 8))
    ]
    raw_moments = [
        advantage_moments(advantage_estimators.get("gae").fn(h, AdvantageParams())) for h in halves
    ]
    merged = RunningMoments.merge_all(raw_moments)
    seen: list[RunningMoments] = []

    def all_reduce(local: RunningMoments) -> RunningMoments:
        seen.append(local)
        return merged

    sharded = [compute_advantages("gae", h, reduce_moments=all_reduce) for h in halves]
    single = compute_advantages("gae", whole)
    torch.testing.assert_close(
        torch.cat([s.advantages for s in sharded]), single.advantages, rtol=1e-12, atol=1e-12
    )
    assert seen == raw_moments  # each rank offered its own statistics


def test_reduce_moments_is_not_called_for_estimators_that_do_not_whiten() -> None:
    def never(local: RunningMoments) -> RunningMoments:
        raise AssertionError("called for an estimator that does not whiten")

    compute_advantages("group_norm", _batch(), reduce_moments=never)


def test_policy_losses_use_the_advantages_as_given() -> None:
    # At ratio 1 the PPO and CPGD token losses are -A * 1 and -A * 0 + ...: with token-mean the
    # PPO loss must be exactly -mean(A). A loss that re-normalised advantages (as LightRFT's did)
    # would give 0 here, since whitened advantages have mean 0.
    advantages = torch.tensor([[1.0, 2.0], [3.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True], [True, False]])
    logprobs = torch.zeros(2, 2, dtype=torch.float64, requires_grad=True)
    inputs = PolicyLossInputs(
        logprobs=logprobs, old_logprobs=logprobs.detach(), advantages=advantages, action_mask=mask
    )
    out = policy_losses.get("ppo").fn(inputs, PolicyLossConfig())
    assert out.loss.item() == pytest.approx(-(1.0 + 2.0 + 3.0) / 3)
