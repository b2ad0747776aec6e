"""Hypothesis strategies and reference helpers shared by the algorithm tests.

Budgets are small on purpose (the suite shares two CPU cores); the tensors are tiny, so a few
dozen examples per property cover ragged masks, holes, empty rows and ties.
"""

from __future__ import annotations

import math

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from torch import Tensor

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

finite = st.floats(min_value=-5.0, max_value=5.0, allow_nan=False, allow_infinity=False)
"""Moderate values: the references below are naive sums that must not overflow."""

GARBAGE = (math.nan, math.inf, -math.inf, 1e30, -7.0)
"""What padding may hold: anything. Masked positions are filled with these in invariance tests."""


@st.composite
def shapes(draw: st.DrawFn, max_rows: int = 5, max_len: int = 6) -> tuple[int, int]:
    return draw(st.integers(1, max_rows)), draw(st.integers(1, max_len))


def matrices(
    rows: int, cols: int, elements: st.SearchStrategy[float] = finite
) -> st.SearchStrategy[Tensor]:
    return st.lists(elements, min_size=rows * cols, max_size=rows * cols).map(
        lambda xs: torch.tensor(xs, dtype=torch.float64).reshape(rows, cols)
    )


def vectors(size: int, elements: st.SearchStrategy[float] = finite) -> st.SearchStrategy[Tensor]:
    return st.lists(elements, min_size=size, max_size=size).map(
        lambda xs: torch.tensor(xs, dtype=torch.float64)
    )


def masks(rows: int, cols: int, *, nonempty_rows: bool = False) -> st.SearchStrategy[Tensor]:
    """Arbitrary masks: ragged rows, holes, and (unless excluded) fully padded rows."""
    row = st.lists(st.booleans(), min_size=cols, max_size=cols)
    if nonempty_rows:
        row = row.filter(any)
    return st.lists(row, min_size=rows, max_size=rows).map(
        lambda r: torch.tensor(r, dtype=torch.bool).reshape(rows, cols)
    )


def right_padded_masks(rows: int, cols: int) -> st.SearchStrategy[Tensor]:
    """Masks of responses of length 1..cols followed by padding (what generation produces)."""
    return st.lists(st.integers(1, cols), min_size=rows, max_size=rows).map(
        lambda lengths: torch.arange(cols).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    )


@st.composite
def grouped(draw: st.DrawFn, max_groups: int = 4, max_size: int = 4) -> Tensor:
    """Group ids with every group of size >= 2, labels arbitrary and rows shuffled."""
    sizes = draw(st.lists(st.integers(2, max_size), min_size=1, max_size=max_groups))
    labels = draw(
        st.lists(st.integers(0, 1000), min_size=len(sizes), max_size=len(sizes), unique=True)
    )
    ids = [label for label, size in zip(labels, sizes, strict=True) for _ in range(size)]
    order = draw(st.permutations(range(len(ids))))
    return torch.tensor([ids[i] for i in order], dtype=torch.long)


def scramble(values: Tensor, mask: Tensor, garbage: float) -> Tensor:
    """``values`` with every masked entry replaced by ``garbage``."""
    return torch.where(mask, values, torch.full_like(values, garbage))


def valid_rows(tensor: Tensor, mask: Tensor) -> list[list[float]]:
    """Per row, the values at valid positions in order (what a naive reference iterates)."""
    return [
        [float(tensor[i, t]) for t in range(tensor.shape[1]) if bool(mask[i, t])]
        for i in range(tensor.shape[0])
    ]
