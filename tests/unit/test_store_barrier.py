"""``every_rank_arrives``: a store barrier that no rank passes before the last arrives, that the
same ranks pass again, and that names the ranks missing when one never comes."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from torch._C._distributed_c10d import HashStore

from lrft.api.errors import CollectiveTimeout
from lrft.dist import every_rank_arrives

KEY = "test/prepared"


def test_no_rank_passes_before_the_last_arrives_and_the_barrier_serves_again() -> None:
    store = HashStore()
    passed: list[tuple[int, int, float]] = []
    arrived_last: dict[int, float] = {}

    def rank(number: int, delay: float) -> None:
        for round_ in (0, 1):
            time.sleep(delay)
            if number == 2:
                arrived_last[round_] = time.monotonic()
            every_rank_arrives(store, KEY, 3, timedelta(seconds=30))
            passed.append((round_, number, time.monotonic()))

    threads = [threading.Thread(target=rank, args=(n, 0.3 if n == 2 else 0.0)) for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted((r, n) for r, n, _ in passed) == [(r, n) for r in (0, 1) for n in range(3)]
    for round_, _, when in passed:
        assert when >= arrived_last[round_]


def test_a_rank_that_never_arrives_is_a_timeout_naming_how_many() -> None:
    store = HashStore()
    with pytest.raises(CollectiveTimeout, match=r"^2 of 3 ranks did not finish"):
        every_rank_arrives(store, KEY, 3, timedelta(seconds=0.2))
