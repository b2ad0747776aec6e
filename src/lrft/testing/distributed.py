"""lrft's multi-process test harness: a pool of spawned ranks that run test functions.

A ``RankPool`` starts ``world_size`` worker processes once (spawn, never fork: CUDA and the
collective backends' threads do not survive a fork), joins them into the default process group
through a file-store rendezvous, then serves many ``run`` calls: starting a rank (a fresh
interpreter importing torch) costs seconds, and CI runs on two cores. Each call has a timeout,
which is also the process group's timeout, so a collective waiting on a dead peer fails instead
of hanging. When ranks fail the parent raises ``RankFailure`` naming every failed rank with its
traceback and every hung rank with its stack, dumped by ``faulthandler`` before the pool is killed.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import pickle
import shutil
import signal
import tempfile
import time
import weakref
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.context import SpawnProcess
from pathlib import Path
from typing import Any, ClassVar, Literal, ParamSpec, TypeVar
from unittest import mock

import attrs
import pytest
import torch

from lrft.dist.split import SplitLayout
from lrft.testing._rank_worker import (
    MIN_STARTUP_S,
    STACK_SIGNAL,
    RankContext,
    Status,
    current_rank_context,
    current_split_groups,
    health_probe,
    threads_per_rank,
    worker_main,
)

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "TIMEOUT_ENV",
    "DeviceType",
    "DistributedSuite",
    "RankContext",
    "RankFailure",
    "RankPool",
    "RankReport",
    "current_rank_context",
    "current_split_groups",
    "default_timeout_s",
    "missing_devices",
    "shared_pool",
]

P = ParamSpec("P")
T = TypeVar("T")
DeviceType = Literal["cpu", "cuda"]

TIMEOUT_ENV = "LRFT_TEST_TIMEOUT"
DEFAULT_TIMEOUT_S = 180.0


@attrs.frozen(kw_only=True)
class RankReport:
    """How one rank ended one call; ``detail`` holds its traceback, or its stack when it hung."""

    rank: int
    status: Status
    summary: str = ""
    detail: str = ""
    exit_code: int | None = None


class RankFailure(AssertionError):
    """Some rank did not return; the message names every failed, dead and hung rank."""

    def __init__(self, message: str, reports: Sequence[RankReport]) -> None:
        super().__init__(message)
        self.reports = tuple(reports)


def default_timeout_s() -> float:
    """The per-call timeout: ``$LRFT_TEST_TIMEOUT`` seconds when set, else 180."""
    value = os.environ.get(TIMEOUT_ENV, str(DEFAULT_TIMEOUT_S))
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"{TIMEOUT_ENV}={value!r} is not a positive number of seconds")
    return seconds


def missing_devices(world_size: int, device_type: DeviceType) -> str | None:
    """Why ``world_size`` ranks on ``device_type`` cannot run here; None when they can."""
    if device_type == "cpu":
        return None
    if not torch.cuda.is_available():
        return f"needs {world_size} CUDA device(s) but CUDA is not available"
    found = torch.cuda.device_count()
    if found < world_size:
        return f"needs {world_size} CUDA devices but only {found} are visible"
    return None


# ----------------------------------------------------------------------------- parent side


class RankPool:
    """``world_size`` spawned ranks with the default process group initialised, serving calls.

    The workers start in the constructor and are awaited by the first ``run``. A hung or dead rank
    breaks the pool: it is killed and closed, and a later ``run`` raises ``RuntimeError``
    (``shared_pool`` hands out a fresh pool instead). ``grace_s`` is how long the other ranks
    may still run after one failed before they count as hung. ``split`` starts the ranks in a
    split placement (:class:`lrft.dist.SplitLayout` of ``world_size`` ranks): each role's ranks
    are then the default group of their processes, and rank-side code finds the span groups
    with ``current_split_groups()``.
    """

    def __init__(
        self,
        world_size: int,
        *,
        device_type: DeviceType = "cpu",
        timeout_s: float | None = None,
        grace_s: float = 5.0,
        split: SplitLayout | None = None,
    ) -> None:
        if split is not None and split.world_size != world_size:
            raise ValueError(f"RankPool({world_size}) given a split layout of {split.world_size}")
        if world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {world_size}")
        if (missing := missing_devices(world_size, device_type)) is not None:
            raise RuntimeError(f"RankPool({world_size}, device_type={device_type!r}) {missing}")
        self.world_size = world_size
        self.device_type: DeviceType = device_type
        self.timeout_s = default_timeout_s() if timeout_s is None else timeout_s
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")
        self.grace_s = grace_s
        self.split = split
        self._workdir = Path(tempfile.mkdtemp(prefix=f"lrft-pool-{world_size}-"))
        self.shared_dir = self._workdir / "shared"
        self.shared_dir.mkdir()
        self._processes, self._conns = self._spawn()
        self._started = False
        self._finalizer = weakref.finalize(
            self, _shut_down, self._processes, self._conns, self._workdir
        )
        _LIVE_POOLS.add(self)

    def _spawn(self) -> tuple[list[SpawnProcess], list[Connection]]:
        spawn = multiprocessing.get_context("spawn")
        processes, conns = [], []
        # A worker imports torch while unpickling its target, before any of its code runs, so
        # OpenMP's thread count must already be in the environment it inherits.
        threads = str(threads_per_rank(self.world_size))
        with mock.patch.dict(os.environ, OMP_NUM_THREADS=threads):
            for rank in range(self.world_size):
                device = torch.device(f"cuda:{rank}" if self.device_type == "cuda" else "cpu")
                context = RankContext(
                    rank=rank,
                    world_size=self.world_size,
                    device=device,
                    shared_dir=self.shared_dir,
                    split=self.split,
                )
                parent_end, child_end = spawn.Pipe()
                args = (context, self._workdir, self.timeout_s, child_end)
                process = spawn.Process(target=worker_main, args=args, name=f"lrft-rank{rank}")
                process.start()
                child_end.close()
                processes.append(process)
                conns.append(parent_end)
        return processes, conns

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> list[T]:
        """``fn(*args, **kwargs)`` on every rank; the per-rank results in rank order.

        Raises ``RankFailure`` when a rank raises, dies or hangs past ``timeout_s``; skips the
        calling test when every rank calls ``pytest.skip``.
        """
        if self.closed:
            raise RuntimeError(f"{self!r} is closed: a rank hung or died earlier, or close()")
        try:
            payload = pickle.dumps((fn, args, kwargs))
        except Exception as error:
            raise TypeError(
                "RankPool.run needs a picklable function and arguments (a module-level function, "
                f"importable classes): {error!r}"
            ) from error
        what = f"running {getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"
        try:
            self._await_start()
            self._send(payload)
            reports, results = self._collect(self.timeout_s)
            self._settle(reports, what)
        except (RankFailure, pytest.skip.Exception):
            raise
        except BaseException:
            self._kill()  # interrupted mid-call (pytest-timeout, Ctrl-C): replies still in flight
            raise
        return [pickle.loads(results[rank]) for rank in range(self.world_size)]

    def _await_start(self) -> None:
        if not self._started:
            reports, _ = self._collect(max(self.timeout_s, MIN_STARTUP_S))
            if any(report.status != "ok" for report in reports):
                self._kill()
                raise RankFailure(_message(reports, "starting the pool"), reports)
            self._started = True

    def _send(self, payload: bytes) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError):  # a dead rank is reported by _collect
                conn.send_bytes(payload)

    def _collect(self, timeout_s: float) -> tuple[list[RankReport], dict[int, bytes]]:
        """Every rank's reply; ranks still running at the deadline are reported as hung."""
        deadline = time.monotonic() + timeout_s
        why_hung = f"did not finish within the {timeout_s:g} s timeout"
        reports: dict[int, RankReport] = {}
        results: dict[int, bytes] = {}
        while len(reports) < self.world_size:
            pending = [rank for rank in range(self.world_size) if rank not in reports]
            owners: dict[Any, int] = {self._conns[rank]: rank for rank in pending}
            owners |= {self._processes[rank].sentinel: rank for rank in pending}
            ready = wait(list(owners), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            for rank in sorted({owners[thing] for thing in ready}):
                reports[rank], results[rank] = self._receive(rank)
                if reports[rank].status != "ok" and time.monotonic() + self.grace_s < deadline:
                    # The other ranks are likely blocked in a collective waiting for this one.
                    deadline = time.monotonic() + self.grace_s
                    why_hung = (
                        f"was still running {self.grace_s:g} s after rank {rank} failed "
                        "(probably waiting for it in a collective)"
                    )
        hung = [rank for rank in range(self.world_size) if rank not in reports]
        for rank, stack in self._dump_stacks(hung).items():
            reports[rank] = RankReport(rank=rank, status="hung", summary=why_hung, detail=stack)
        return [reports[rank] for rank in range(self.world_size)], results

    def _receive(self, rank: int) -> tuple[RankReport, bytes]:
        conn, process = self._conns[rank], self._processes[rank]
        with contextlib.suppress(EOFError, OSError):
            if conn.poll():
                status, summary, data = conn.recv()
                if status == "ok":
                    return RankReport(rank=rank, status="ok"), data
                return RankReport(rank=rank, status=status, summary=summary, detail=data), b""
        process.join(timeout=5.0)  # its end of the pipe closed: it is exiting
        code = process.exitcode
        summary = f"died with exit code {code}"
        if code is not None and code < 0:
            summary += f" (killed by {signal.Signals(-code).name})"
        # what faulthandler wrote at a fatal signal (a segfault in C code), if it got that far
        stack = self._workdir / f"stack-rank{rank}.txt"
        detail = stack.read_text(errors="replace") if _size(stack) > 0 else ""
        report = RankReport(
            rank=rank, status="died", summary=summary, detail=detail, exit_code=code
        )
        return report, b""

    def _dump_stacks(self, ranks: Sequence[int]) -> dict[int, str]:
        """Signal the ranks' faulthandler, then read each dump once it stops growing."""
        files = {rank: self._workdir / f"stack-rank{rank}.txt" for rank in ranks}
        offsets = {rank: _size(path) for rank, path in files.items()}
        for rank in ranks:
            pid = self._processes[rank].pid
            if pid is not None and self._processes[rank].is_alive():
                os.kill(pid, STACK_SIGNAL)
        last, deadline = dict(offsets), time.monotonic() + 5.0
        while ranks and time.monotonic() < deadline:
            time.sleep(0.2)
            sizes = {rank: _size(path) for rank, path in files.items()}
            if all(offsets[rank] < sizes[rank] == last[rank] for rank in ranks):
                break
            last = sizes
        return {
            rank: path.read_bytes()[offsets[rank] :].decode(errors="replace")
            if path.exists() and _size(path) > offsets[rank]
            else "(no stack: the rank had not registered its stack dump or did not answer)"
            for rank, path in files.items()
        }

    def _settle(self, reports: Sequence[RankReport], what: str) -> None:
        """Keep, check or kill the pool after a call, then raise or skip as its outcome says."""
        statuses = {report.status for report in reports}
        broken = bool(statuses & {"died", "hung"})
        if broken or (statuses != {"ok"} and not self._healthy()):
            self._kill()
        if statuses == {"skipped"}:
            pytest.skip("; ".join(dict.fromkeys(report.summary for report in reports)))
        if statuses != {"ok"}:
            raise RankFailure(_message(reports, what), reports)

    def _healthy(self) -> bool:
        # After a rank raised, a peer may have left a collective unmatched: one all_reduce with a
        # short deadline tells a pool that can go on from one that must be replaced.
        self._send(pickle.dumps((health_probe, (), {})))
        reports, results = self._collect(max(self.grace_s, 10.0))
        return all(
            report.status == "ok"
            and pickle.loads(results[report.rank]) == self._group_size(report.rank)
            for report in reports
        )

    def _group_size(self, rank: int) -> int:
        """The size of ``rank``'s default group: the world, or its role's in a split pool."""
        return self.world_size if self.split is None else self.split.role_world_size(rank)

    def _kill(self) -> None:
        for process in self._processes:
            process.kill()
        self.close()

    def close(self) -> None:
        """Stop the workers (killing those that do not stop) and delete the pool's folder."""
        self._finalizer()

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        split = "" if self.split is None else f", split={self.split}"
        return f"RankPool({self.world_size}, device_type={self.device_type!r}{split}, {state})"


def _shut_down(processes: list[SpawnProcess], conns: list[Connection], workdir: Path) -> None:
    # Module-level, so that the pool's finalizer does not keep the pool alive.
    for conn in conns:
        with contextlib.suppress(OSError):
            conn.send_bytes(b"")
    deadline = time.monotonic() + 10.0
    for process, conn in zip(processes, conns, strict=True):
        process.join(timeout=max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()
        conn.close()
    shutil.rmtree(workdir, ignore_errors=True)


def _message(reports: Sequence[RankReport], what: str) -> str:
    failed = [report for report in reports if report.status != "ok"]
    by_status: dict[str, list[str]] = {}
    for report in failed:
        by_status.setdefault(report.status, []).append(str(report.rank))
    counts = "; ".join(f"{status}: {', '.join(ranks)}" for status, ranks in by_status.items())
    lines = [f"{what} failed on {len(failed)} of {len(reports)} ranks ({counts}):"]
    for report in failed:
        lines.append(f"--- rank {report.rank} " + _HEADLINES[report.status].format(report.summary))
        lines.extend("    " + line for line in report.detail.rstrip().splitlines())
    return "\n".join(lines)


_HEADLINES = {
    "raised": "raised {}",
    "skipped": "skipped ({}) while other ranks did not: ranks disagree",
    "died": "{}",
    "hung": "hung: it {}; its stack:",
}


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


# ----------------------------------------------------------------------------- shared pools

_LIVE_POOLS: weakref.WeakSet[RankPool] = weakref.WeakSet()
_SHARED_POOLS: dict[tuple[int, DeviceType, SplitLayout | None], RankPool] = {}


@atexit.register
def _close_live_pools() -> None:
    # Registered after multiprocessing's exit hook (imported above), so this runs first: that
    # hook joins every non-daemonic child and would wait forever on an open pool's workers.
    for pool in list(_LIVE_POOLS):
        pool.close()


def shared_pool(
    world_size: int, device_type: DeviceType = "cpu", *, split: SplitLayout | None = None
) -> RankPool:
    """The process-wide pool for ``(world_size, device_type, split)``, replaced when it broke."""
    key = (world_size, device_type, split)
    pool = _SHARED_POOLS.get(key)
    if pool is None or pool.closed:
        pool = _SHARED_POOLS[key] = RankPool(world_size, device_type=device_type, split=split)
    return pool


class DistributedSuite:
    """Base for multi-process test classes: the ``pool`` fixture is the shared pool they need.

    A subclass sets ``world_size`` (and ``device_type = "cuda"`` to run on NCCL, skipped where
    too few GPUs are visible); its tests call ``pool.run(module_level_function, ...)``.
    """

    world_size: ClassVar[int] = 1
    device_type: ClassVar[DeviceType] = "cpu"

    @pytest.fixture
    def pool(self) -> RankPool:
        cls = type(self)
        if (missing := missing_devices(cls.world_size, cls.device_type)) is not None:
            pytest.skip(f"{cls.__name__} {missing}")
        return shared_pool(cls.world_size, cls.device_type)
