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
    goes through DTensor's Python properties) and kept for the model's life: FSDP2 keeps its
    shapes while moves and checkpoint loads replace the shards' data."""

    name: str
    param: torch.Tensor
    mesh_ranks: int  # 0: not row-sharded (gathered by DTensor itself)
    floating: bool
    numel: int  # of the full tensor
    mesh: int = 0  # id() of the device mesh (row-sharded only)
    rows: int = 0  # rows each rank sends, padding included (row-sharded only)
    width: int = 0  # elements each rank sends, padding included
    full: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())  # the full tensor's shape, strides
    shard: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())  # this rank's shard's


def entry_of(name: str, param: torch.Tensor) -> Entry:
    floating = param.dtype.is_floating_point
    if not _row_sharded(param):
        return Entry(name, param, 0, floating, param.numel())
    sharded = cast(DTensor, param)
    ranks = sharded.device_mesh.size()
    rows = -(-param.shape[0] // ranks)
    local = sharded._local_tensor
    return Entry(
        name,
        param,
        ranks,
        floating,
        param.numel(),
        mesh=id(sharded.device_mesh),
        rows=rows,
        width=rows * math.prod(param.shape[1:]),
        full=(tuple(param.shape), _contiguous(param.shape)),
        shard=(tuple(local.shape), _contiguous(local.shape)),
    )


def _contiguous(shape: torch.Size) -> tuple[int, ...]:
    return tuple(torch.empty(shape, device="meta").stride())


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
    entries: list[Entry]

    def wait(self) -> None:
        if self.work is not None:
            self.work.wait()

    def finish(self) -> list[torch.Tensor]:
        """Waits for the collective, then copies every parameter's rank-major blocks out
        contiguously in one fused call, padding rows cut off."""
        self.wait()
        world = self.world
        out = torch.empty_like(self.received)
        # Each parameter's full tensor (padded) lies at its own offset of ``out``; its blocks
        # and the tensor handed out are both views made directly from the recorded layout, one
        # call each: views derived step by step cost host time per parameter that, on W1's 290
        # tensors, exceeds the collective.
        blocks: list[torch.Tensor] = []
        full: list[torch.Tensor] = []
        offset = 0
        for entry in self.entries:
            blocks.append(out.as_strided((world, entry.width), (entry.width, 1), offset))
            full.append(out.as_strided(*entry.full, offset))
            offset += world * entry.width
        # FSDP2's own copy-out op: one kernel for the whole bucket on CUDA.
        widths = [entry.width for entry in self.entries]
        torch.split_with_sizes_copy(self.received.view(world, -1), widths, dim=1, out=blocks)
        return full


@torch.no_grad()
def _start_rows(entries: list[Entry], device: torch.device, dtype: torch.dtype) -> _RowsInFlight:
    """Issues one all-gather of every row-sharded parameter of ``entries`` (one mesh of several
    ranks), in ``dtype``: each rank's shard is cast into a flat buffer, padded to
    ``ceil(rows / world)`` rows."""
    first = entries[0].param
    assert isinstance(first, DTensor)
    mesh = first.device_mesh
    world = mesh.size()
    # Left uninitialised: shards are split torch.chunk style, so in the gathered tensor every
    # real row comes before every padding row, and the full tensors handed out end before the
    # padding.
    send = torch.empty(sum(entry.width for entry in entries), dtype=dtype, device=device)
    slots: list[torch.Tensor] = []
    offset = 0
    for entry in entries:
        slots.append(send.as_strided(*entry.shard, offset))
        offset += entry.width
    # _local_tensor: to_local() re-wraps each shard as a Parameter view, per parameter per sync;
    # read on every sync, since moves replace the shards
    shards = [cast(DTensor, entry.param)._local_tensor for entry in entries]
    # one fused copy (and cast) of every shard into its slot
    torch._foreach_copy_(slots, shards)
    received = torch.empty(world * send.numel(), dtype=dtype, device=device)
    work = all_gather_into(received, send, group=mesh.get_group(), async_op=True)
    return _RowsInFlight(work, world, received, send, entries)


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
            batches.setdefault((entry.mesh, gathered_dtype(entry, gather_dtype)), []).append(index)
        elif entry.mesh_ranks == 1:
            # a 1-rank mesh: the shard is the whole tensor
            shard = cast(DTensor, entry.param)._local_tensor
            ready[index] = shard.detach().to(device)
        else:
            ready[index] = _full_tensor(entry.param, device)
    gathers = [
        (indices, _start_rows([entries[i] for i in indices], device, dtype))
        for (_, dtype), indices in batches.items()
    ]
    return _BucketInFlight([entry.name for entry in entries], ready, gathers)
