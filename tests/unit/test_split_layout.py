"""SplitLayout as pure data: the roles partition the world as the placement says, checked by
hand-countable properties and hand-written cases, with no process group."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lrft.api import ConfigError
from lrft.dist import SplitLayout


@st.composite
def layouts(draw: st.DrawFn) -> SplitLayout:
    world = draw(st.integers(min_value=2, max_value=48))
    rollout = draw(st.integers(min_value=1, max_value=world - 1))
    tp = draw(st.sampled_from([d for d in range(1, rollout + 1) if rollout % d == 0]))
    return SplitLayout(world_size=world, rollout_world_size=rollout, tp_size=tp)


@given(layouts())
def test_roles_partition_the_world_trainers_first(layout: SplitLayout) -> None:
    world, rollout = layout.world_size, layout.rollout_world_size
    assert layout.train_ranks + layout.rollout_ranks == tuple(range(world))
    assert len(layout.rollout_ranks) == rollout == world - layout.train_world_size
    for rank in range(world):
        role = layout.role_of(rank)
        assert role == ("train" if rank < world - rollout else "rollout")
        mine = layout.train_ranks if role == "train" else layout.rollout_ranks
        assert mine[layout.role_rank(rank)] == rank
        assert layout.role_world_size(rank) == len(mine)


@given(layouts())
def test_tp_groups_are_consecutive_rollout_ranks_covering_them_once(layout: SplitLayout) -> None:
    flat = [rank for group in layout.tp_groups for rank in group]
    assert flat == list(layout.rollout_ranks)
    for group in layout.tp_groups:
        assert len(group) == layout.tp_size
        assert list(group) == list(range(group[0], group[0] + layout.tp_size))
        for rank in group:
            assert layout.tp_group_of(rank) == group


@given(layouts())
def test_span_is_the_sender_and_every_rollout_rank(layout: SplitLayout) -> None:
    assert layout.span_ranks == (0, *layout.rollout_ranks)
    assert layout.role_of(layout.span_ranks[0]) == "train"


def test_a_hand_counted_layout() -> None:
    layout = SplitLayout(world_size=6, rollout_world_size=4, tp_size=2)
    assert layout.train_ranks == (0, 1)
    assert layout.rollout_ranks == (2, 3, 4, 5)
    assert layout.tp_groups == ((2, 3), (4, 5))
    assert layout.span_ranks == (0, 2, 3, 4, 5)
    assert layout.role_rank(4) == 2
    assert layout.describe(0) == "rank 0 (trainer rank 0 of 2, the sender)"
    assert layout.describe(5) == "rank 5 (rollout rank 3 of 4, TP group (4, 5))"


@pytest.mark.parametrize(
    ("world", "rollout", "tp", "message"),
    [
        (
            3,
            3,
            1,
            "rollout_world_size 3 leaves no rank to train: world_size 3 - rollout_world_size 3 = 0",
        ),
        (4, 5, 1, "world_size 4 - rollout_world_size 5 = -1 trainer ranks, must be >= 1"),
        (
            5,
            3,
            2,
            "rollout_world_size 3 is not divisible by tp_size 2 (rollout_world_size % tp_size = 1",
        ),
        (0, 1, 1, "world_size must be a positive integer, got 0"),
        (3, 1, 0, "tp_size must be a positive integer, got 0"),
    ],
)
def test_invalid_layouts_print_the_formula(world: int, rollout: int, tp: int, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        SplitLayout(world_size=world, rollout_world_size=rollout, tp_size=tp)
    assert message in str(caught.value)


def test_ranks_outside_the_world_and_trainer_tp_groups_are_refused() -> None:
    layout = SplitLayout(world_size=3, rollout_world_size=1)
    with pytest.raises(ConfigError, match=r"rank 3 is outside \[0, world_size=3\)"):
        layout.role_of(3)
    with pytest.raises(ConfigError, match="rank 1 trains: it holds no engine"):
        layout.tp_group_of(1)
