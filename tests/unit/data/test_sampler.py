"""The resumable distributed sampler: hand-checked orders and hypothesis properties."""

from __future__ import annotations

import json
from collections import Counter
from typing import NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lrft.api import ConfigError
from lrft.data import DistributedPromptSampler, SamplerBatch, SamplerPosition, eval_indices

FAST = settings(max_examples=60, deadline=None)


def make(
    n: int,
    batch: int,
    world: int,
    rank: int = 0,
    *,
    seed: int = 0,
    shuffle: bool = True,
    drop_last: bool = True,
) -> DistributedPromptSampler:
    return DistributedPromptSampler(
        num_samples=n,
        global_batch_size=batch,
        rank=rank,
        world_size=world,
        seed=seed,
        shuffle=shuffle,
        drop_last=drop_last,
    )


def ranks(
    n: int, batch: int, world: int, *, seed: int = 0, shuffle: bool = True, drop_last: bool = True
) -> list[DistributedPromptSampler]:
    return [
        make(n, batch, world, rank, seed=seed, shuffle=shuffle, drop_last=drop_last)
        for rank in range(world)
    ]


def draw_batches(sampler: DistributedPromptSampler, count: int) -> list[SamplerBatch]:
    return [sampler.next_batch() for _ in range(count)]


def global_batches(samplers: list[DistributedPromptSampler], count: int) -> list[tuple[int, ...]]:
    """Each global batch as the ranks' shares joined in rank order."""
    per_rank = [draw_batches(sampler, count) for sampler in samplers]
    return [
        tuple(i for share in shares for i in share.indices)
        for shares in zip(*per_rank, strict=True)
    ]


# --- hand-checked orders (no shuffle) ---------------------------------------------------------


def test_unshuffled_drop_last_splits_each_batch_into_contiguous_shares() -> None:
    rank0, rank1 = ranks(10, 4, 2, shuffle=False)
    assert [b.indices for b in draw_batches(rank0, 3)] == [(0, 1), (4, 5), (0, 1)]
    assert [b.indices for b in draw_batches(rank1, 3)] == [(2, 3), (6, 7), (2, 3)]
    # 8 and 9 are left over in every epoch: drop_last leaves the incomplete batch out.
    assert rank0.batches_per_epoch == 2
    assert rank0.samples_per_epoch == 8


def test_unshuffled_keep_last_completes_the_last_batch_from_the_epochs_start() -> None:
    rank0, rank1 = ranks(10, 4, 2, shuffle=False, drop_last=False)
    assert [b.indices for b in draw_batches(rank0, 3)] == [(0, 1), (4, 5), (8, 9)]
    assert [b.indices for b in draw_batches(rank1, 3)] == [(2, 3), (6, 7), (0, 1)]
    tiny = make(3, 4, 1, shuffle=False, drop_last=False)  # fewer samples than one batch
    assert tiny.next_batch().indices == (0, 1, 2, 0)


def test_batches_carry_their_epoch_and_index_and_iteration_ends_with_the_epoch() -> None:
    sampler = make(6, 2, 1, shuffle=False)
    assert [(b.epoch, b.index) for b in sampler] == [(0, 0), (0, 1), (0, 2)]
    assert sampler.position == SamplerPosition(epoch=1, consumed_samples=0)
    sampler.next_batch()
    assert len(sampler) == 2
    assert [(b.epoch, b.index) for b in sampler] == [(1, 1), (1, 2)]
    assert sampler.total_consumed_samples == 12


def test_state_dict_is_plain_json() -> None:
    sampler = make(10, 4, 2, seed=3)
    sampler.next_batch()
    state = sampler.state_dict()
    assert (
        json.loads(json.dumps(state))
        == state
        == {
            "epoch": 0,
            "consumed_samples": 4,
            "num_samples": 10,
            "global_batch_size": 4,
            "seed": 3,
            "shuffle": True,
            "drop_last": True,
            "world_size": 2,
        }
    )


# --- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_samples": 0}, "num_samples must be a positive integer"),
        ({"global_batch_size": 6, "world_size": 4}, r"6 is not divisible by world_size 4"),
        ({"rank": 2, "world_size": 2}, r"rank 2 is outside \[0, world_size=2\)"),
        ({"num_samples": 3}, "num_samples 3 < global_batch_size 4"),
    ],
)
def test_invalid_settings_are_rejected(kwargs: dict[str, int], message: str) -> None:
    settings_ = {"num_samples": 10, "global_batch_size": 4, "rank": 0, "world_size": 2} | kwargs
    with pytest.raises(ConfigError, match=message):
        DistributedPromptSampler(
            num_samples=settings_["num_samples"],
            global_batch_size=settings_["global_batch_size"],
            rank=settings_["rank"],
            world_size=settings_["world_size"],
        )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_samples", 11),
        ("global_batch_size", 2),
        ("seed", 1),
        ("shuffle", False),
        ("drop_last", False),
    ],
)
def test_loading_a_state_saved_under_other_settings_names_the_setting(
    field: str, value: object
) -> None:
    state: dict[str, object] = dict(make(10, 4, 2).state_dict())
    state[field] = value
    with pytest.raises(ConfigError, match=f"saved with {field}={value!r} but this sampler has"):
        make(10, 4, 2).load_state_dict(state)


@pytest.mark.parametrize("consumed", [3, 8, -4])
def test_loading_an_impossible_position_is_an_error(consumed: int) -> None:
    state: dict[str, object] = dict(make(10, 4, 2).state_dict())
    state["consumed_samples"] = consumed
    with pytest.raises(ConfigError, match=f"consumed_samples={consumed} is not a multiple"):
        make(10, 4, 2).load_state_dict(state)


# --- properties -----------------------------------------------------------------------------


class Setup(NamedTuple):
    n: int
    batch: int
    world: int
    seed: int
    shuffle: bool
    drop_last: bool

    def samplers(self, world: int | None = None) -> list[DistributedPromptSampler]:
        """One fresh sampler per rank (at ``world`` ranks when given)."""
        return ranks(
            self.n,
            self.batch,
            world or self.world,
            seed=self.seed,
            shuffle=self.shuffle,
            drop_last=self.drop_last,
        )


@st.composite
def setups(draw: st.DrawFn) -> Setup:
    world = draw(st.integers(1, 4))
    batch = world * draw(st.integers(1, 4))
    drop_last = draw(st.booleans())
    return Setup(
        n=draw(st.integers(batch if drop_last else 1, 40)),
        batch=batch,
        world=world,
        seed=draw(st.integers(0, 2**40)),
        shuffle=draw(st.booleans()),
        drop_last=drop_last,
    )


@FAST
@given(setups())
def test_each_epoch_covers_the_indices_in_disjoint_shares(setup: Setup) -> None:
    samplers = setup.samplers()
    n, batch = setup.n, setup.batch
    bpe = samplers[0].batches_per_epoch
    for epoch in range(2):
        batches = global_batches(samplers, bpe)
        assert all(len(b) == batch for b in batches)
        if n >= batch:  # shares of one batch are disjoint (when a batch fits in the data)
            assert all(len(set(b)) == batch for b in batches)
        seen = Counter(i for b in batches for i in b)
        if setup.drop_last:
            assert max(seen.values()) == 1
            assert sum(seen.values()) == (n // batch) * batch
            if n % batch == 0:
                assert set(seen) == set(range(n))
        else:
            assert set(seen) == set(range(n))
            assert sum(seen.values()) == -(-n // batch) * batch
        assert all(s.position == SamplerPosition(epoch=epoch + 1) for s in samplers)


@FAST
@given(setups(), st.data())
def test_resume_at_any_point_continues_the_uninterrupted_sequence(
    setup: Setup, data: st.DataObject
) -> None:
    bpe = setup.samplers()[0].batches_per_epoch
    stop = data.draw(st.integers(0, 3 * bpe), label="stop")
    more = data.draw(st.integers(1, 2 * bpe), label="more")
    for rank, uninterrupted in enumerate(setup.samplers()):
        expected = draw_batches(uninterrupted, stop + more)
        first = setup.samplers()[rank]
        head = draw_batches(first, stop)
        state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint stores it
        resumed = setup.samplers()[rank]
        resumed.load_state_dict(state)
        assert head + draw_batches(resumed, more) == expected


@FAST
@given(setups(), st.data())
def test_resume_at_another_world_size_continues_the_same_global_batches(
    setup: Setup, data: st.DataObject
) -> None:
    new_world = data.draw(st.sampled_from([w for w in range(1, 5) if setup.batch % w == 0]))
    bpe = setup.samplers()[0].batches_per_epoch
    stop = data.draw(st.integers(0, 2 * bpe), label="stop")
    expected = global_batches(setup.samplers(), stop + bpe)
    before = setup.samplers()
    head = global_batches(before, stop)
    resumed = setup.samplers(world=new_world)
    for sampler in resumed:
        sampler.load_state_dict(before[0].state_dict())
    assert head + global_batches(resumed, bpe) == expected


@FAST
@given(st.integers(20, 60), st.integers(0, 2**40), st.integers(0, 2**40))
def test_different_seeds_and_epochs_give_different_orders(n: int, seed: int, other: int) -> None:
    sampler = make(n, 4, 1, seed=seed)
    order = sampler.epoch_order(0)
    assert len(set(order)) == len(order) == n - n % 4
    assert sampler.epoch_order(0) != sampler.epoch_order(1)
    if other != seed:
        assert make(n, 4, 1, seed=other).epoch_order(0) != sampler.epoch_order(0)
    assert make(n, 4, 1, seed=seed).epoch_order(3) == sampler.epoch_order(3)  # deterministic


def test_seed_and_epoch_are_not_interchangeable() -> None:
    # torch's DistributedSampler seeds with seed + epoch, so seed 1 epoch 0 == seed 0 epoch 1.
    assert make(32, 4, 1, seed=0).epoch_order(1) != make(32, 4, 1, seed=1).epoch_order(0)


@FAST
@given(st.integers(0, 50), st.integers(1, 6))
def test_eval_indices_cover_every_index_exactly_once(n: int, world: int) -> None:
    shares = [list(eval_indices(n, rank=rank, world_size=world)) for rank in range(world)]
    assert sorted(i for share in shares for i in share) == list(range(n))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_eval_indices_by_hand_and_validation() -> None:
    assert list(eval_indices(7, rank=1, world_size=3)) == [1, 4]
    with pytest.raises(ConfigError, match=r"rank 3 is outside \[0, world_size=3\)"):
        eval_indices(7, rank=3, world_size=3)
