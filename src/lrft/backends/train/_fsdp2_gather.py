"""Gathering FSDP2's sharded parameters into full tensors for weight sync: one coalesced
all-gather per mesh and dtype for a bucket of row-sharded parameters (each rank's shards cast,
when asked, into one send buffer with one fused copy), which writes every parameter's full
tensor in place, issued asynchronously so that the next bucket travels while the caller loads
the previous one."""

from __future__ import annotations

import math
import operator
from typing import NamedTuple, cast

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

from lrft.dist.collectives import all_gather_into_many


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
    exact: bool = True  # every rank holds ``rows`` rows: no padding travels
    cast: bool = True  # may be cast to a gather dtype (not a weight merged after gathering)


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
        exact=rows * ranks == param.shape[0],
    )


def _contiguous(shape: torch.Size) -> tuple[int, ...]:
    return tuple(torch.empty(shape, device="meta").stride())


def gathered_dtype(entry: Entry, gather_dtype: torch.dtype | None) -> torch.dtype:
    """``gather_dtype`` for a floating-point parameter row-sharded over several ranks (cast
    before the collective), else the parameter's own."""
    if gather_dtype is not None and entry.floating and entry.cast and entry.mesh_ranks > 1:
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
    entries = [entry_of(name, p) for name, p in named]
    return BucketPlan(entries, device, gather_dtype).start().finish()


def _free(tensor: torch.Tensor) -> None:
    tensor.untyped_storage().resize_(0)


def _allocate(tensor: torch.Tensor) -> None:
    storage = tensor.untyped_storage()
    if storage.nbytes() == 0:
        storage.resize_(tensor.numel() * tensor.element_size())


class _Rows:
    """The all-gather of a bucket's row-sharded parameters on one mesh, in one dtype, planned
    once and run sync after sync.

    Each rank's shards are cast, in one fused copy, into consecutive slots of a send buffer,
    each slot padded to ``ceil(rows / world)`` rows. Parameter ``p`` gathers its slot from every
    rank into its own region of the receive buffer, in rank order (one coalesced collective for
    all of them): shards are split ``torch.chunk`` style, so that region holds the full tensor,
    its rows in order, followed by any padding rows. The full tensors are views of those
    regions, written by the collective itself, so nothing is copied out afterwards.

    The buffers and their views are made once: making a view costs microseconds of host time,
    and with hundreds of parameters that exceeds the collective. Between uses the buffers hold
    no memory: their storages are resized to nothing (as FSDP2 frees its unsharded parameters),
    and back when the bucket is gathered again, which the views survive."""

    def __init__(self, entries: list[Entry], device: torch.device, dtype: torch.dtype) -> None:
        first = entries[0].param
        assert isinstance(first, DTensor)
        mesh = first.device_mesh
        world = mesh.size()
        self.group = mesh.get_group()
        self.params = [entry.param for entry in entries]
        # Left uninitialised: padding rows come after every real row, beyond the full views.
        self.send = torch.empty(sum(entry.width for entry in entries), dtype=dtype, device=device)
        self.received = torch.empty(world * self.send.numel(), dtype=dtype, device=device)
        self.slots: list[torch.Tensor] = []
        self.inputs: list[torch.Tensor] = []
        self.outputs: list[torch.Tensor] = []
        self.full: list[torch.Tensor] = []
        offset = 0
        for entry in entries:
            slot = self.send.as_strided(*entry.shard, offset)
            whole = self.received.as_strided(*entry.full, world * offset)
            self.slots.append(slot)
            self.full.append(whole)
            if entry.exact:
                # the slot and the full tensor are exactly what travels
                self.inputs.append(slot)
                self.outputs.append(whole)
            else:
                self.inputs.append(self.send.as_strided((entry.width,), (1,), offset))
                self.outputs.append(
                    self.received.as_strided((world * entry.width,), (1,), world * offset)
                )
            offset += entry.width

    def start(self) -> dist.Work | None:
        """Casts the shards into the send buffer and issues the collective, asynchronously."""
        _allocate(self.send)
        _allocate(self.received)
        # _local_tensor: to_local() re-wraps each shard as a Parameter view, per parameter per
        # sync; read on every sync, since moves replace the shards
        shards = list(map(_LOCAL_TENSOR, self.params))
        torch._foreach_copy_(self.slots, shards)
        return all_gather_into_many(self.outputs, self.inputs, group=self.group, async_op=True)

    def release(self, *, received: bool) -> None:
        """Frees the send buffer, and the receive buffer (the full tensors' storage) if asked;
        only once the current stream is ordered after the collective (or it never ran)."""
        _free(self.send)
        if received:
            _free(self.received)


_LOCAL_TENSOR = operator.attrgetter("_local_tensor")


class BucketPlan:
    """How one bucket of parameters is gathered: an asynchronous all-gather per mesh and dtype
    for row-sharded parameters (each planned once, see ``_Rows``); DTensor's own (blocking)
    gather for any other layout."""

    def __init__(
        self, entries: list[Entry], device: torch.device, gather_dtype: torch.dtype | None
    ) -> None:
        if gather_dtype is not None and not gather_dtype.is_floating_point:
            gather_dtype = None
        self.device = device
        self.entries = entries
        self.names = [entry.name for entry in entries]
        batches: dict[tuple[int, torch.dtype], list[int]] = {}
        self.other: list[int] = []
        for index, entry in enumerate(entries):
            if entry.mesh_ranks > 1:
                key = (entry.mesh, gathered_dtype(entry, gather_dtype))
                batches.setdefault(key, []).append(index)
            else:
                self.other.append(index)
        self.rows = [
            (indices, _Rows([entries[i] for i in indices], device, dtype))
            for (_, dtype), indices in batches.items()
        ]
        self.release(received=True)

    @torch.no_grad()
    def start(self) -> BucketInFlight:
        """Issues the bucket's collectives."""
        ready: list[torch.Tensor | None] = [None] * len(self.entries)
        for index in self.other:
            entry = self.entries[index]
            if entry.mesh_ranks == 1:
                # a 1-rank mesh: the shard is the whole tensor
                shard = cast(DTensor, entry.param)._local_tensor
                ready[index] = shard.detach().to(self.device)
            else:
                ready[index] = _full_tensor(entry.param, self.device)
        works = [rows.start() for _, rows in self.rows]
        return BucketInFlight(self, ready, works)

    def release(self, *, received: bool) -> None:
        for _, rows in self.rows:
            rows.release(received=received)


class BucketInFlight(NamedTuple):
    """A bucket whose collectives are issued: the full tensors of parameters that needed no
    all-gather of rows, and the all-gathers of the rest."""

    plan: BucketPlan
    ready: list[torch.Tensor | None]
    works: list[dist.Work | None]

    def wait(self) -> None:
        for work in self.works:
            if work is not None:
                work.wait()

    @torch.no_grad()
    def finish(self) -> list[tuple[str, torch.Tensor]]:
        """The bucket's full tensors, once the collectives have written them (on a GPU: once
        the current stream is ordered after them; the host does not wait). The send buffers
        are freed."""
        self.wait()
        self.plan.release(received=False)
        full = list(self.ready)
        for indices, rows in self.plan.rows:
            for index, tensor in zip(indices, rows.full, strict=True):
                full[index] = tensor
        return [
            (name, tensor)
            for name, tensor in zip(self.plan.names, full, strict=True)
            if tensor is not None
        ]
