"""Gathering FSDP2's sharded parameters into full tensors for weight sync: one all-gather per
mesh and dtype for a bucket of row-sharded parameters (each rank's shards packed into one
buffer, cast first when asked), copied out in one fused call, and issued asynchronously so that
the next bucket travels while the caller loads the previous one."""

from __future__ import annotations

import math
from typing import NamedTuple, cast

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

from lrft.dist.collectives import all_gather_into


@torch.no_grad()
def _full_tensor(param: torch.Tensor, device: torch.device) -> torch.Tensor:
    if not isinstance(param, DTensor):
        return param.detach()
    if param.device != device:
        # Offloaded (or CPUOffloadPolicy) shards: gather on the compute device, whose process
        # group backend (NCCL) cannot read host memory.
        moved = param.to(device)
        assert isinstance(moved, DTensor)
        param = moved
    return param.full_tensor()


def _row_sharded(param: torch.Tensor) -> bool:
    """FSDP2's layout: dim 0 split over a 1-D mesh, ``torch.chunk`` style (the last ranks may
    hold fewer rows, or none)."""
    return (
        isinstance(param, DTensor)
        and param.device_mesh.ndim == 1
        and tuple(param.placements) == (Shard(0),)
        and param.dim() > 0
    )


class Entry(NamedTuple):
    """A parameter and the facts about its layout that a gather needs, read once (each read
    goes through DTensor's Python properties)."""

    name: str
    param: torch.Tensor
    mesh_ranks: int  # 0: not row-sharded (gathered by DTensor itself)
    floating: bool


def entry_of(name: str, param: torch.Tensor) -> Entry:
    ranks = cast(DTensor, param).device_mesh.size() if _row_sharded(param) else 0
    return Entry(name, param, ranks, param.dtype.is_floating_point)


def gathered_dtype(entry: Entry, gather_dtype: torch.dtype | None) -> torch.dtype:
    """``gather_dtype`` for a floating-point parameter row-sharded over several ranks (cast
    before the collective), else the parameter's own."""
    if gather_dtype is not None and entry.floating and entry.mesh_ranks > 1:
        return gather_dtype
    return entry.param.dtype


def gather_full(
    named: list[tuple[str, torch.Tensor]],
    device: torch.device,
    gather_dtype: torch.dtype | None = None,
) -> list[tuple[str, torch.Tensor]]:
    """The full tensors of ``named`` (same order), gathered with one collective per mesh and
    dtype instead of one per tensor. Collective over the parameters' meshes. Row-sharded
    floating-point parameters are cast to ``gather_dtype`` (when given, and a float dtype)
    before the collective.

    On a 1-rank mesh the local shard is the whole tensor: it is returned as it is, with no
    collective, no cast and no copy.
    """
    return start_gather([entry_of(name, p) for name, p in named], device, gather_dtype).finish()


class _RowsInFlight(NamedTuple):
    """One issued all-gather of several row-sharded parameters (one mesh, one dtype)."""

    work: dist.Work | None
    world: int
    received: torch.Tensor  # every rank's send buffer, in rank order
    send: torch.Tensor  # referenced until the collective has completed
    params: list[torch.Tensor]
    rows: list[int]  # rows each rank sends per parameter, padding included
    widths: list[int]  # elements each rank sends per parameter, padding included

    def wait(self) -> None:
        if self.work is not None:
            self.work.wait()

    def finish(self) -> list[torch.Tensor]:
        """Waits for the collective, then copies every parameter's rank-major blocks out
        contiguously in one fused call, padding rows cut off."""
        self.wait()
        world = self.world
        out = torch.empty_like(self.received)
        blocks = [
            block.view(world, width)
            for block, width in zip(
                out.split_with_sizes([world * w for w in self.widths]), self.widths, strict=True
            )
        ]
        # FSDP2's own copy-out op: one kernel for the whole bucket on CUDA, where a reshape per
        # parameter costs a kernel launch and Python work each.
        torch.split_with_sizes_copy(self.received.view(world, -1), self.widths, dim=1, out=blocks)
        return [
            block.view(world * r, *param.shape[1:])[: param.shape[0]]
            for block, r, param in zip(blocks, self.rows, self.params, strict=True)
        ]


@torch.no_grad()
def _start_rows(
    params: list[torch.Tensor], device: torch.device, dtype: torch.dtype
) -> _RowsInFlight:
    """Issues one all-gather of every row-sharded parameter in ``params`` (one mesh of several
    ranks), in ``dtype``: each rank's shard is cast into a flat buffer, padded to
    ``ceil(rows / world)`` rows."""
    first = params[0]
    assert isinstance(first, DTensor)
    mesh = first.device_mesh
    world = mesh.size()
    # _local_tensor: to_local() re-wraps each shard as a Parameter view, per parameter per sync
    shards = [p._local_tensor if isinstance(p, DTensor) else p for p in params]
    rows = [-(-p.shape[0] // world) for p in params]
    widths = [r * math.prod(p.shape[1:]) for r, p in zip(rows, params, strict=True)]
    # Left uninitialised: shards are split torch.chunk style, so in the gathered tensor every
    # real row comes before every padding row, and the copy-out cuts the padding off with
    # [:rows] without reading it.
    send = torch.empty(sum(widths), dtype=dtype, device=device)
    # One fused copy (and cast) of every shard into its slot; one split cuts every slot and its
    # padding apart, cheaper than slicing each slot.
    sizes = [n for s, w in zip(shards, widths, strict=True) for n in (s.numel(), w - s.numel())]
    torch._foreach_copy_(list(send.split_with_sizes(sizes)[::2]), [s.reshape(-1) for s in shards])
    received = torch.empty(world * send.numel(), dtype=dtype, device=device)
    work = all_gather_into(received, send, group=mesh.get_group(), async_op=True)
    return _RowsInFlight(work, world, received, send, params, rows, widths)


class _BucketInFlight(NamedTuple):
    """A bucket whose collectives are issued: the full tensors of parameters that needed no
    all-gather of rows, and the all-gathers of the rest, by position in the bucket."""

    names: list[str]
    ready: list[torch.Tensor | None]
    gathers: list[tuple[list[int], _RowsInFlight]]

    def wait(self) -> None:
        for _, gather in self.gathers:
            gather.wait()

    @torch.no_grad()
    def finish(self) -> list[tuple[str, torch.Tensor]]:
        full = list(self.ready)
        for indices, gather in self.gathers:
            for index, tensor in zip(indices, gather.finish(), strict=True):
                full[index] = tensor
        return [
            (name, tensor)
            for name, tensor in zip(self.names, full, strict=True)
            if tensor is not None
        ]


@torch.no_grad()
def start_gather(
    entries: list[Entry], device: torch.device, gather_dtype: torch.dtype | None
) -> _BucketInFlight:
    """Issues the collectives that gather ``entries``: one asynchronous all-gather per mesh and
    dtype for row-sharded parameters; DTensor's own (blocking) gather for any other layout."""
    if gather_dtype is not None and not gather_dtype.is_floating_point:
        gather_dtype = None
    ready: list[torch.Tensor | None] = [None] * len(entries)
    batches: dict[tuple[int, torch.dtype], list[int]] = {}
    for index, entry in enumerate(entries):
        if entry.mesh_ranks > 1:
            mesh = cast(DTensor, entry.param).device_mesh
            batches.setdefault((id(mesh), gathered_dtype(entry, gather_dtype)), []).append(index)
        elif entry.mesh_ranks == 1:
            # a 1-rank mesh: the shard is the whole tensor
            shard = cast(DTensor, entry.param)._local_tensor
            ready[index] = shard.detach().to(device)
        else:
            ready[index] = _full_tensor(entry.param, device)
    gathers = [
        (indices, _start_rows([entries[i].param for i in indices], device, dtype))
        for (_, dtype), indices in batches.items()
    ]
    return _BucketInFlight([entry.name for entry in entries], ready, gathers)
