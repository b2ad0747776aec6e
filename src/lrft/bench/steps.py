"""The one step window and the one median of every side-by-side benchmark.

``lrft bench`` and the TRL scripts that run beside it (``scripts/trl_grpo.py``,
``scripts/trl_vl1.py``) both summarise their step times here, so that a ratio of their figures
compares the same statistic over the same steps: the steps from ``steady_from`` (1-based) to the
last are the steady ones (the first are warm-up: allocator growth, kernel selection, graph
capture and compilation), and a figure is the median of its values over them, the mean of the
two middle values for an even count.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def steady_window(values: Sequence[T], steady_from: int) -> list[T]:
    """The values of steps ``steady_from`` (1-based) to the last; all of them when there are
    fewer steps than that (a short dry run), so that a summary always has something to read."""
    if steady_from < 1:
        raise ValueError(f"steady_from is 1-based and must be >= 1, got {steady_from}")
    window = list(values[steady_from - 1 :])
    return window if window else list(values)


def median(values: Sequence[float]) -> float:
    """The median (the mean of the two middle values for an even count); 0.0 for no values."""
    return float(statistics.median(values)) if values else 0.0


def steady_median(values: Sequence[float], steady_from: int) -> float:
    """The median of the steady window of ``values``."""
    return median(steady_window(values, steady_from))
