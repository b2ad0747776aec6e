"""The split placement's run plan and the trainer's checks of what arrives, with no process.

- ``rollout_events`` against the trainer's own order (``RLTrainer.fit``: a sync at the start, an
  evaluation at step 0, then per step its batch, training, the sync of the next version, the
  evaluations ``eval_steps`` asks for): the same syncs and evaluations in the same order, every
  batch once, after the sync of the newest weights it may use, never more than K behind;
- the staleness histogram by hand;
- a batch lagging more than K, or another batch than the step's, is refused by name; a batch is
  cut into whole contiguous groups, one share per trainer rank, in the sampler's order.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lrft.api import GenerationResult, LrftError
from lrft.rewards import RewardOutput
from lrft.trainer.async_rollout import checked_share, cut_batch
from lrft.trainer.split_plan import (
    RolloutShare,
    RunStart,
    eval_due,
    rollout_events,
    staleness_metrics,
)


def _trainer_order(start: int, total: int, every: int, evaluates: bool) -> list[tuple[str, int]]:
    """What the trainer does, in ``RLTrainer._fit``'s words (the sync of version v is the one
    after training step v's batch, v - 1 in 0-based steps)."""
    order = [("sync", start)]
    if start == 0 and evaluates:
        order.append(("eval", 0))
    for step in range(start, total):
        order += [("take", step), ("sync", step + 1)]
        finished = step + 1 == total
        if evaluates and ((every > 0 and (step + 1) % every == 0) or finished):
            order.append(("eval", step + 1))
    return order


@given(
    start=st.integers(0, 6),
    length=st.integers(0, 12),
    every=st.sampled_from([-1, 1, 2, 3, 5]),
    evaluates=st.booleans(),
    staleness=st.integers(0, 3),
)
def test_the_rollout_ranks_follow_the_trainer_within_the_bound(
    start: int, length: int, every: int, evaluates: bool, staleness: int
) -> None:
    total = start + length
    plan = RunStart(step=start, total=total, sampler={}, evaluates=evaluates, eval_every=every)
    events = list(rollout_events(plan, staleness))
    trainer = _trainer_order(start, total, every, evaluates)
    # the collectives both sides take part in, in the same order
    assert [e for e in events if e[0] != "generate"] == [e for e in trainer if e[0] != "take"]
    # every batch of the run once, in order, each after the sync of the newest weights it may
    # use and before the trainer needs it
    generated = [
        (index, position) for position, (kind, index) in enumerate(events) if kind == "generate"
    ]
    assert [b for b, _ in generated] == list(range(start, total))
    for batch, position in generated:
        synced = [v for kind, v in events[:position] if kind == "sync"]
        version = synced[-1]
        assert version == max(start, batch - staleness)
        assert 0 <= batch - version <= staleness
        # the trainer takes batch b after its sync of version b: the rollout ranks have made it
        # by then (no wait on weights the trainer has not sent yet)
        assert version <= batch


def test_synchronous_and_one_step_behind_by_hand() -> None:
    plan = RunStart(step=0, total=3, sampler={}, evaluates=True, eval_every=2)
    assert list(rollout_events(plan, 0)) == [
        ("sync", 0), ("eval", 0), ("generate", 0),
        ("sync", 1), ("generate", 1),
        ("sync", 2), ("eval", 2), ("generate", 2),
        ("sync", 3), ("eval", 3),
    ]  # fmt: skip
    assert list(rollout_events(plan, 1)) == [
        ("sync", 0), ("eval", 0), ("generate", 0), ("generate", 1),
        ("sync", 1), ("generate", 2),
        ("sync", 2), ("eval", 2),
        ("sync", 3), ("eval", 3),
    ]  # fmt: skip


def test_a_resumed_run_does_not_evaluate_where_it_resumes() -> None:
    assert not eval_due(4, start=4, total=8, every=2)
    assert eval_due(6, start=4, total=8, every=2)
    assert eval_due(7, start=4, total=7, every=-1)
    assert eval_due(0, start=0, total=7, every=-1)


def test_the_staleness_histogram_by_hand() -> None:
    metrics = staleness_metrics(torch.tensor([0, 1, 1, 2]), 2)
    assert metrics == {
        "staleness/0": 0.25,
        "staleness/1": 0.5,
        "staleness/2": 0.25,
        "staleness/mean": 1.0,
        "staleness/max": 2.0,
    }


def _share(batch: int, version: int, indices: tuple[int, ...], n: int = 2) -> RolloutShare:
    results = tuple(
        GenerationResult(
            request_id=str(i),
            sample_index=s,
            prompt_token_ids=(i + 1,),
            output_token_ids=(i + 1, s),
            finish_reason="stop",
        )
        for i in indices
        for s in range(n)
    )
    scores = [float(10 * i + s) for i in indices for s in range(n)]
    return RolloutShare.of(
        batch=batch,
        version=version,
        indices=indices,
        results=results,
        rewards=RewardOutput(scores=scores, metrics={"length": [2.0] * len(scores)}),
        seconds={"generate": 1.0},
    )


def test_a_batch_older_than_the_bound_is_refused_by_name() -> None:
    share = _share(batch=5, version=3, indices=(1, 2))
    assert checked_share(share, step=5, max_staleness=2, where="rank 2") is share
    with pytest.raises(LrftError) as caught:
        checked_share(share, step=5, max_staleness=1, where="rank 2 (rollout rank 0 of 1)")
    assert str(caught.value) == (
        "rank 2 (rollout rank 0 of 1) generated batch 5 with the weights of version 3, 2 "
        "versions behind the trainer's 5: the bound is max_staleness 1"
    )
    with pytest.raises(LrftError, match="rank 2 sent batch 4 when the trainer takes batch 5"):
        checked_share(
            _share(batch=4, version=4, indices=(1,)), step=5, max_staleness=1, where="rank 2"
        )
    with pytest.raises(LrftError, match="versions behind"):  # weights from the future
        checked_share(_share(batch=5, version=6, indices=(1,)), step=5, max_staleness=1, where="r")


def test_a_batch_is_cut_into_whole_groups_in_the_samplers_order() -> None:
    # two rollout ranks' shares of a batch of 6 prompts, cut for three trainer ranks
    parts = [_share(7, 6, (10, 11, 12)), _share(7, 6, (13, 14, 15))]
    shares = cut_batch(parts, ranks=3, n=2)
    assert [s.indices for s in shares] == [(10, 11), (12, 13), (14, 15)]
    for share in shares:
        assert share.version == 6
        assert share.batch == 7
        assert [r.prompt_token_ids[0] - 1 for r in share.results] == [
            i for i in share.indices for _ in range(2)
        ]
        assert share.rewards.scores == tuple(
            float(10 * i + s) for i in share.indices for s in range(2)
        )
        assert share.rewards.metrics["length"] == (2.0,) * 4
    with pytest.raises(LrftError, match="came from weight versions \\[5, 6\\]"):
        cut_batch([_share(7, 5, (1, 2)), _share(7, 6, (3, 4))], ranks=1, n=2)
