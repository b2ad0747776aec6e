"""Process-group start-up: the backend follows the device (gloo on CPU, NCCL on CUDA)."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from lrft.dist.rank import RankInfo

DEFAULT_TIMEOUT = timedelta(minutes=10)


def backend_for(device: torch.device) -> str:
    """The collective backend for ``device``: ``nccl`` for CUDA, ``gloo`` otherwise."""
    return "nccl" if device.type == "cuda" else "gloo"


def init_distributed(
    rank_info: RankInfo | None = None,
    *,
    timeout: timedelta = DEFAULT_TIMEOUT,
    init_method: str | None = None,
) -> RankInfo:
    """Initialise the default process group for this rank and return its ``RankInfo``.

    ``rank_info`` defaults to torchrun's environment; ``init_method`` to torchrun's rendezvous
    (``env://``). ``timeout`` bounds every collective: a rank that waits longer on a peer fails
    instead of hanging. Idempotent when the group already exists with the same world size.
    """
    info = rank_info if rank_info is not None else RankInfo.from_env()
    if dist.is_initialized():
        if dist.get_world_size() != info.world_size or dist.get_rank() != info.rank:
            raise RuntimeError(
                f"torch.distributed is already initialised as rank {dist.get_rank()} of "
                f"{dist.get_world_size()}, not rank {info.rank} of {info.world_size}"
            )
        return info
    if info.device.type == "cuda":
        torch.cuda.set_device(info.device)
    dist.init_process_group(
        backend_for(info.device),
        init_method=init_method,
        rank=info.rank,
        world_size=info.world_size,
        timeout=timeout,
    )
    return info


def close_distributed() -> None:
    """Leave the default process group: wait until every rank is here, then destroy the group.

    Collective; call it once a run has ended well on every rank (a failed rank's peers are
    stopped by torchrun instead). Without it the rank that finishes first exits while its peers'
    groups still hold connections to it, and a peer can abort in the C++ runtime as its
    interpreter tears the live group down ("terminate called without an active exception").
    A no-op when no group exists.
    """
    if not dist.is_initialized():
        return
    dist.barrier()
    dist.destroy_process_group()
