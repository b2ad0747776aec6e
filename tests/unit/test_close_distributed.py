"""``close_distributed``: no rank leaves the group before every rank has reached it, and the
group is gone afterwards (a second call, or a call without a group, does nothing)."""

from __future__ import annotations

import multiprocessing
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from lrft.dist import RankInfo, close_distributed, init_distributed

LATE_S = 1.0
"""How long rank 1 works on after rank 0 has reached ``close_distributed``."""


def _rank(rank: int, workdir: Path) -> None:
    info = RankInfo(
        rank=rank, local_rank=rank, world_size=2, local_world_size=2, device=torch.device("cpu")
    )
    rendezvous = (workdir / "rendezvous").as_uri()
    init_distributed(info, timeout=timedelta(seconds=60), init_method=rendezvous)
    if rank == 1:
        time.sleep(LATE_S)  # still working while rank 0 is already leaving
        (workdir / "rank1-arrived").touch()
    close_distributed()
    if rank == 0 and not (workdir / "rank1-arrived").exists():
        raise AssertionError("rank 0 left the group before rank 1 reached close_distributed")
    if dist.is_initialized():
        raise AssertionError(f"rank {rank}: the group survived close_distributed")
    close_distributed()  # a second call has no group to close


def test_no_rank_leaves_before_every_rank_arrives_and_the_group_is_gone(tmp_path: Path) -> None:
    spawn = multiprocessing.get_context("spawn")
    ranks = [spawn.Process(target=_rank, args=(rank, tmp_path)) for rank in range(2)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(timeout=120)
    assert [process.exitcode for process in ranks] == [0, 0]  # a failed check exits with 1
