"""The worker side of lrft's multi-process test harness: what each spawned rank runs (start-up,
rendezvous into the default process group, then serving pickled calls until told to stop), and
``current_rank_context`` for rank-side test functions. See :mod:`lrft.testing.distributed`."""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import multiprocessing
import os
import pickle
import signal
import sys
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import IO, Any, Literal

import attrs
import pytest
import torch
import torch.distributed as dist

from lrft.dist.init import init_distributed
from lrft.dist.rank import RankInfo
from lrft.dist.split import SplitGroups, SplitLayout, init_split_distributed

Status = Literal["ok", "raised", "skipped", "died", "hung"]
Reply = tuple[Status, str, Any]  # (status, one-line summary, pickled result or text)

# Every rank imports torch while starting; on two busy cores that alone can outlast the short
# timeouts of failure tests, so start-up always gets at least this long.
MIN_STARTUP_S = 180.0
STACK_SIGNAL = signal.SIGUSR1


@attrs.frozen(kw_only=True)
class RankContext:
    """Where a rank-side function runs: its rank, the pool's size, its device, a shared folder."""

    rank: int
    world_size: int
    device: torch.device  # cpu, or cuda:<rank> in a cuda pool
    shared_dir: Path  # fresh per pool, kept across its calls: use per-test names inside it
    # A split pool's placement: each role's ranks are then the default group of their
    # processes, and the span groups join them (``current_split_groups``).
    split: SplitLayout | None = None


_CONTEXT: RankContext | None = None
_SPLIT_GROUPS: SplitGroups | None = None
_STACK_FILE: IO[str] | None = None  # held open: faulthandler writes to its descriptor


def current_rank_context() -> RankContext:
    """The ``RankContext`` of the worker this runs in; RuntimeError outside a pool's worker."""
    if _CONTEXT is None:
        raise RuntimeError("current_rank_context() called outside a RankPool worker process")
    return _CONTEXT


def current_split_groups() -> SplitGroups:
    """The groups of a split pool's worker (see ``RankPool``'s ``split``)."""
    if _SPLIT_GROUPS is None:
        raise RuntimeError("current_split_groups() called outside a split RankPool's worker")
    return _SPLIT_GROUPS


def worker_main(context: RankContext, workdir: Path, timeout_s: float, conn: Connection) -> None:
    """Start, report ready (or why not), then serve calls until the parent says stop or goes."""
    try:
        _start_worker(context, workdir, timeout_s)
    except BaseException:
        conn.send(("raised", "could not start", traceback.format_exc()))
        return
    conn.send(("ok", "", pickle.dumps(None)))
    with contextlib.suppress(EOFError, OSError):  # EOF: the parent is gone
        while payload := conn.recv_bytes():
            conn.send(_execute(payload))
    # Reached on a healthy group only: the parent kills a pool whose ranks hung or disagree.
    dist.destroy_process_group()


def _start_worker(context: RankContext, workdir: Path, timeout_s: float) -> None:
    global _CONTEXT, _STACK_FILE, _SPLIT_GROUPS
    # Workers are not daemonic (a rank may start processes of its own: DataLoader workers,
    # engines), so Linux is asked to kill them if the test process dies without closing the pool.
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    parent = multiprocessing.parent_process()
    if parent is None or os.getppid() != parent.pid:
        os._exit(1)  # the parent died before the line above took effect
    # Ctrl-C reaches the whole process group; the parent handles it and closes the pool.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _STACK_FILE = (workdir / f"stack-rank{context.rank}.txt").open("w")
    faulthandler.register(STACK_SIGNAL, file=_STACK_FILE, all_threads=True)
    # A fatal signal (a crash in C code) dumps the stack too: the parent shows it for the rank.
    faulthandler.enable(file=_STACK_FILE, all_threads=True)
    torch.set_num_threads(threads_per_rank(context.world_size))
    _wait_for_peers(context, workdir, max(timeout_s, MIN_STARTUP_S))
    rank, size = context.rank, context.world_size
    info = RankInfo(
        rank=rank, local_rank=rank, world_size=size, local_world_size=size, device=context.device
    )
    rendezvous = (workdir / "rendezvous").as_uri()
    timeout = timedelta(seconds=timeout_s)
    if context.split is not None:
        _SPLIT_GROUPS = init_split_distributed(
            context.split, rank=rank, device=context.device, timeout=timeout, init_method=rendezvous
        )
    else:
        init_distributed(info, timeout=timeout, init_method=rendezvous)
    _CONTEXT = context


def threads_per_rank(world_size: int) -> int:
    return max(1, (os.cpu_count() or 1) // world_size)


def _wait_for_peers(context: RankContext, workdir: Path, timeout_s: float) -> None:
    # The file-store rendezvous gives up after the pool's timeout, which failure tests keep short,
    # and ranks still importing torch would miss it: so first wait until every rank has arrived.
    (workdir / f"arrived-rank{context.rank}").touch()
    deadline = time.monotonic() + timeout_s
    while len(list(workdir.glob("arrived-rank*"))) < context.world_size:
        if time.monotonic() > deadline:
            raise TimeoutError(f"not every rank arrived within {timeout_s:g} s")
        time.sleep(0.05)


def _execute(payload: bytes) -> Reply:
    try:
        fn, args, kwargs = pickle.loads(payload)
    except BaseException as error:
        hint = "is the module that defines it importable by name from sys.path?"
        return (
            "raised",
            f"could not unpickle the call ({error!r}); {hint}",
            traceback.format_exc(),
        )
    try:
        result = fn(*args, **kwargs)
    except pytest.skip.Exception as skip:
        return ("skipped", str(skip), "")
    except BaseException as error:
        return ("raised", f"{type(error).__name__}: {error}", traceback.format_exc())
    try:
        return ("ok", "", pickle.dumps(result))
    except BaseException as error:
        summary = f"its {type(result).__name__} result could not be pickled: {error!r}"
        return ("raised", summary, traceback.format_exc())


def health_probe() -> float:
    ones = torch.ones(1, device=current_rank_context().device)
    dist.all_reduce(ones)
    return float(ones.item())
