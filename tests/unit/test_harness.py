"""The multi-process harness: results, rank context, failures, hangs, deaths, skips and reuse.

Rank-side functions live at module level: the workers unpickle them by reference, importing
``tests.unit.test_harness`` by name.
"""

from __future__ import annotations

import os
import sys
import time
import types
import uuid
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.distributed as dist

from lrft.testing.distributed import (
    DistributedSuite,
    RankContext,
    RankFailure,
    RankPool,
    current_rank_context,
    default_timeout_s,
    missing_devices,
    shared_pool,
)

# Short enough to keep the failure tests quick, long enough for two busy cores.
FAILURE_TIMEOUT_S = 10.0


def _sum_of_ranks_plus_one(world_size: int) -> float:
    return world_size * (world_size + 1) / 2


# ----------------------------------------------------------------------------- rank-side functions


def _rank_and_sum() -> tuple[int, float]:
    context = current_rank_context()
    value = torch.tensor([float(context.rank + 1)])
    dist.all_reduce(value)
    # Higher ranks answer first, so rank order in the results is the harness's doing.
    time.sleep(0.05 * (context.world_size - context.rank))
    return context.rank, value.item()


def _describe_context(token: str) -> tuple[RankContext, str, int, str | None, str]:
    context = current_rank_context()
    marker = context.shared_dir / f"marker-{token}"
    if context.rank == 0:
        marker.write_text(token)
    dist.barrier()
    backend = str(dist.get_backend())
    return (
        context,
        marker.read_text(),
        torch.get_num_threads(),
        os.environ.get("OMP_NUM_THREADS"),
        backend,
    )


def _process_group_timeout_s() -> float:
    group = dist.distributed_c10d._get_default_group()
    backend = group._get_backend(current_rank_context().device)
    seconds: float = backend.options._timeout.total_seconds()
    return seconds


def _echo(a: int, /, b: int, *, c: str = "default") -> tuple[int, int, int, str]:
    return current_rank_context().rank, a, b, c


def _raise_on_rank_zero_while_rank_one_waits() -> None:
    if current_rank_context().rank == 0:
        raise ValueError("rank zero is broken")
    dist.barrier()


def _raise_everywhere() -> None:
    raise RuntimeError(f"rank {current_rank_context().rank} says no")


def _sleep_on_rank(rank: int, seconds: float) -> str:
    if current_rank_context().rank == rank:
        time.sleep(seconds)
    return "awake"


def _exit_on_rank_one(code: int) -> str:
    if current_rank_context().rank == 1:
        os._exit(code)
    return "fine"


def _crash_in_c_on_rank_one() -> str:
    if current_rank_context().rank == 1:
        import ctypes

        ctypes.string_at(0)  # reads address 0: SIGSEGV inside C code
    return "ok"


def _skip_on(ranks: frozenset[int]) -> str:
    if current_rank_context().rank in ranks:
        pytest.skip("no widget on this rank")
    return "ran"


def _return_unpicklable() -> Callable[[], None]:
    return lambda: None


def _noop() -> None:
    return None


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture
def failure_pool() -> Iterator[RankPool]:
    """A private, started pool with a short timeout, for tests that break their pool."""
    with RankPool(2, timeout_s=FAILURE_TIMEOUT_S) as pool:
        pool.run(_noop)  # start-up is not what the failure tests time
        yield pool


def _statuses(failure: RankFailure) -> dict[int, str]:
    return {report.rank: report.status for report in failure.reports}


# ----------------------------------------------------------------------------- results


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_results_come_back_in_rank_order(world_size: int) -> None:
    results = shared_pool(world_size).run(_rank_and_sum)

    expected = _sum_of_ranks_plus_one(world_size)
    assert results == [(rank, expected) for rank in range(world_size)]


def test_rank_context_describes_each_rank() -> None:
    pool = shared_pool(2)
    token = uuid.uuid4().hex

    results = pool.run(_describe_context, token)

    threads = max(1, (os.cpu_count() or 1) // 2)
    for rank, (context, seen, torch_threads, omp_threads, backend) in enumerate(results):
        assert context == RankContext(
            rank=rank, world_size=2, device=torch.device("cpu"), shared_dir=pool.shared_dir
        )
        assert seen == token, "rank 1 must read what rank 0 wrote into the shared folder"
        assert (torch_threads, omp_threads, backend) == (threads, str(threads), "gloo")
    assert pool.shared_dir.is_dir()


def test_arguments_and_keyword_arguments_reach_every_rank() -> None:
    assert shared_pool(2).run(_echo, 1, b=2, c="given") == [(0, 1, 2, "given"), (1, 1, 2, "given")]


def test_the_timeout_is_the_process_group_timeout() -> None:
    with RankPool(1, timeout_s=37.0) as pool:
        assert pool.run(_process_group_timeout_s) == [37.0]


def test_current_rank_context_outside_a_worker_raises() -> None:
    with pytest.raises(RuntimeError, match="outside a RankPool worker"):
        current_rank_context()


# ----------------------------------------------------------------------------- failures


def test_a_raising_rank_is_named_with_its_traceback_and_its_blocked_peer_with_its_stack(
    failure_pool: RankPool,
) -> None:
    start = time.monotonic()
    with pytest.raises(RankFailure) as caught:
        failure_pool.run(_raise_on_rank_zero_while_rank_one_waits)
    elapsed = time.monotonic() - start

    failure = caught.value
    message = str(failure)
    assert _statuses(failure) == {0: "raised", 1: "hung"}
    assert "rank 0 raised ValueError: rank zero is broken" in message
    assert 'raise ValueError("rank zero is broken")' in message  # the child's own source line
    hung_section = message[message.index("--- rank 1 hung") :]
    assert "in barrier" in hung_section
    assert "in _raise_on_rank_zero_while_rank_one_waits" in hung_section
    # The grace period, not the full timeout, decided that rank 1 hung.
    assert elapsed < FAILURE_TIMEOUT_S
    assert failure_pool.closed


def test_a_hung_rank_is_reported_with_its_stack_within_the_timeout(failure_pool: RankPool) -> None:
    start = time.monotonic()
    with pytest.raises(RankFailure) as caught:
        failure_pool.run(_sleep_on_rank, 1, 600.0)
    elapsed = time.monotonic() - start

    failure = caught.value
    assert _statuses(failure) == {0: "ok", 1: "hung"}
    assert "in _sleep_on_rank" in failure.reports[1].detail
    assert f"did not finish within the {FAILURE_TIMEOUT_S:g} s timeout" in str(failure)
    assert FAILURE_TIMEOUT_S <= elapsed < FAILURE_TIMEOUT_S + 10.0
    assert failure_pool.closed


def test_a_dead_rank_is_reported_with_its_exit_code(failure_pool: RankPool) -> None:
    with pytest.raises(RankFailure) as caught:
        failure_pool.run(_exit_on_rank_one, 3)

    failure = caught.value
    assert _statuses(failure) == {0: "ok", 1: "died"}
    assert failure.reports[1].exit_code == 3
    assert "rank 1 died with exit code 3" in str(failure)
    assert failure_pool.closed


def test_a_rank_that_crashes_in_c_is_reported_with_its_python_stack(
    failure_pool: RankPool,
) -> None:
    with pytest.raises(RankFailure) as caught:
        failure_pool.run(_crash_in_c_on_rank_one)

    failure = caught.value
    assert _statuses(failure) == {0: "ok", 1: "died"}
    assert "rank 1 died with exit code -11 (killed by SIGSEGV)" in str(failure)
    assert "Segmentation fault" in failure.reports[1].detail
    assert "in _crash_in_c_on_rank_one" in failure.reports[1].detail
    assert failure_pool.closed


def test_every_failed_rank_is_named_and_the_pool_stays_usable() -> None:
    pool = shared_pool(2)
    with pytest.raises(RankFailure) as caught:
        pool.run(_raise_everywhere)

    assert _statuses(caught.value) == {0: "raised", 1: "raised"}
    assert "rank 0 says no" in str(caught.value)
    assert "rank 1 says no" in str(caught.value)
    assert shared_pool(2) is pool
    assert pool.run(_rank_and_sum) == [(0, 3.0), (1, 3.0)]


def test_shared_pool_replaces_a_broken_pool() -> None:
    broken = shared_pool(2)
    with pytest.raises(RankFailure):
        broken.run(_exit_on_rank_one, 3)
    assert broken.closed
    with pytest.raises(RuntimeError, match="closed"):
        broken.run(_noop)

    fresh = shared_pool(2)
    assert fresh is not broken
    assert fresh.run(_rank_and_sum) == [(0, 3.0), (1, 3.0)]


def test_an_unpicklable_result_is_reported() -> None:
    with pytest.raises(RankFailure, match="could not be pickled") as caught:
        shared_pool(2).run(_return_unpicklable)
    assert _statuses(caught.value) == {0: "raised", 1: "raised"}


def test_an_unpicklable_function_is_refused_in_the_parent() -> None:
    with pytest.raises(TypeError, match="picklable"):
        shared_pool(1).run(lambda: None)


def test_a_function_the_workers_cannot_import_is_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A module that exists only in this process: it pickles by name, but no worker can import it.
    module = types.ModuleType("lrft_harness_phantom")
    exec("def phantom():\n    return 1\n", module.__dict__)
    monkeypatch.setitem(sys.modules, module.__name__, module)

    with pytest.raises(RankFailure, match="importable by name") as caught:
        shared_pool(2).run(module.phantom)
    assert _statuses(caught.value) == {0: "raised", 1: "raised"}


# ----------------------------------------------------------------------------- skips


def test_a_skip_on_every_rank_skips_the_test() -> None:
    with pytest.raises(pytest.skip.Exception, match="no widget on this rank"):
        shared_pool(2).run(_skip_on, frozenset({0, 1}))


def test_a_skip_on_some_ranks_is_a_failure() -> None:
    pool = shared_pool(2)
    with pytest.raises(RankFailure, match="ranks disagree") as caught:
        pool.run(_skip_on, ranks=frozenset({1}))

    assert _statuses(caught.value) == {0: "ok", 1: "skipped"}
    assert "no widget on this rank" in str(caught.value)
    assert not pool.closed


# ----------------------------------------------------------------------------- configuration


def test_timeout_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LRFT_TEST_TIMEOUT", raising=False)
    assert default_timeout_s() == 180.0
    monkeypatch.setenv("LRFT_TEST_TIMEOUT", "7.5")
    assert default_timeout_s() == 7.5
    monkeypatch.setenv("LRFT_TEST_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="LRFT_TEST_TIMEOUT"):
        default_timeout_s()


def test_missing_cuda_devices_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    assert missing_devices(4, "cpu") is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert missing_devices(2, "cuda") == "needs 2 CUDA device(s) but CUDA is not available"
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        RankPool(2, device_type="cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert missing_devices(2, "cuda") == "needs 2 CUDA devices but only 1 are visible"
    assert missing_devices(1, "cuda") is None


class TestDistributedSuiteOnCpu(DistributedSuite):
    world_size = 2

    def test_pool_fixture_is_the_shared_pool(self, pool: RankPool) -> None:
        assert pool is shared_pool(2)
        assert pool.run(_rank_and_sum) == [(0, 3.0), (1, 3.0)]


def _cuda_rank_sum() -> tuple[str, str, float]:
    context = current_rank_context()
    value = torch.tensor([float(context.rank + 1)], device=context.device)
    dist.all_reduce(value)
    return str(value.device), str(dist.get_backend()), value.item()


class TestDistributedSuiteOnCuda(DistributedSuite):
    """Skipped without two CUDA devices; on a GPU host it runs the same harness on NCCL."""

    world_size = 2
    device_type = "cuda"

    def test_each_rank_has_its_own_device_and_nccl(self, pool: RankPool) -> None:
        assert pool.run(_cuda_rank_sum) == [("cuda:0", "nccl", 3.0), ("cuda:1", "nccl", 3.0)]
