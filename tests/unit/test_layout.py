"""RolloutLayout as pure data: partitions checked by hand-countable properties, no process group."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lrft.api import ConfigError
from lrft.dist import RolloutLayout


@st.composite
def layouts(draw: st.DrawFn) -> RolloutLayout:
    world = draw(st.integers(min_value=1, max_value=64))
    tp = draw(st.sampled_from([d for d in range(1, world + 1) if world % d == 0]))
    return RolloutLayout(world_size=world, tp_size=tp)


def _is_partition(groups: tuple[tuple[int, ...], ...], world: int) -> bool:
    flat = [rank for group in groups for rank in group]
    return sorted(flat) == list(range(world))


@given(layouts())
def test_groups_partition_the_world_with_the_right_sizes(layout: RolloutLayout) -> None:
    world, tp = layout.world_size, layout.tp_size
    assert _is_partition(layout.tp_groups, world)
    assert _is_partition(layout.dp_groups, world)
    assert len(layout.tp_groups) == world // tp == layout.dp_size
    assert len(layout.dp_groups) == tp
    assert all(len(group) == tp for group in layout.tp_groups)
    assert all(len(group) == world // tp for group in layout.dp_groups)


@given(layouts())
def test_each_rank_meets_its_tp_and_dp_group_only_in_itself(layout: RolloutLayout) -> None:
    for rank in range(layout.world_size):
        tp_group, dp_group = layout.tp_group_of(rank), layout.dp_group_of(rank)
        assert sum(rank in group for group in layout.tp_groups) == 1
        assert sum(rank in group for group in layout.dp_groups) == 1
        assert set(tp_group) & set(dp_group) == {rank}
        assert tp_group[layout.tp_rank(rank)] == rank


@given(layouts())
def test_tp_groups_are_consecutive_and_dp_groups_strided(layout: RolloutLayout) -> None:
    for group in layout.tp_groups:
        assert list(group) == list(range(group[0], group[0] + layout.tp_size))
        assert group[0] % layout.tp_size == 0
    for group in layout.dp_groups:
        assert all(b - a == layout.tp_size for a, b in itertools.pairwise(group))


def test_known_layout_by_hand() -> None:
    layout = RolloutLayout(world_size=8, tp_size=4)
    assert layout.tp_groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert layout.dp_groups == ((0, 4), (1, 5), (2, 6), (3, 7))


@given(st.integers(min_value=1, max_value=64), st.integers(min_value=1, max_value=64))
def test_indivisible_sizes_raise_with_the_formula(world: int, tp: int) -> None:
    if world % tp == 0:
        assert RolloutLayout(world_size=world, tp_size=tp).dp_size == world // tp
        return
    with pytest.raises(ConfigError, match=f"world_size {world} is not divisible by tp_size {tp}"):
        RolloutLayout(world_size=world, tp_size=tp)


@pytest.mark.parametrize(("world", "tp"), [(0, 1), (4, 0), (-2, 1), (4, -1)])
def test_non_positive_sizes_raise(world: int, tp: int) -> None:
    with pytest.raises(ConfigError, match="must be a positive integer"):
        RolloutLayout(world_size=world, tp_size=tp)


def test_rank_outside_world_raises() -> None:
    layout = RolloutLayout(world_size=4, tp_size=2)
    with pytest.raises(ConfigError, match=r"rank 4 is outside \[0, world_size=4\)"):
        layout.tp_group_of(4)


def test_build_groups_needs_an_initialised_process_group() -> None:
    with pytest.raises(RuntimeError, match="initialised"):
        RolloutLayout(world_size=1, tp_size=1).build_groups()
