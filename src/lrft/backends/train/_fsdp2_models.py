"""The handles the ``fsdp2`` backend returns: frozen and trainable FSDP2-sharded models."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import NamedTuple, cast

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, Shard
from torch.optim.lr_scheduler import LambdaLR

from lrft.api.types import Location, ModelPart, StepReport
from lrft.backends.train import _fsdp2_checkpoint as checkpoint
from lrft.backends.train._placement import OffloadableModel
from lrft.dist.collectives import all_gather_into

NAME = "fsdp2"

# Segments that wrappers insert into parameter names (torch.compile, activation checkpointing,
# FSDP1); fully_shard itself keeps the original names.
_WRAPPER_SEGMENTS = ("_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.")


def hf_name(name: str) -> str:
    """``name`` without the segments wrapper modules add, i.e. the Hugging Face name."""
    for segment in _WRAPPER_SEGMENTS:
        name = name.replace(segment, "")
    return name


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


class _Entry(NamedTuple):
    """A parameter and the facts about its layout that a gather needs, read once (each read
    goes through DTensor's Python properties)."""

    name: str
    param: torch.Tensor
    mesh_ranks: int  # 0: not row-sharded (gathered by DTensor itself)
    floating: bool


def _entry(name: str, param: torch.Tensor) -> _Entry:
    ranks = cast(DTensor, param).device_mesh.size() if _row_sharded(param) else 0
    return _Entry(name, param, ranks, param.dtype.is_floating_point)


def _gathered_dtype(entry: _Entry, gather_dtype: torch.dtype | None) -> torch.dtype:
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
    return _start_gather([_entry(name, p) for name, p in named], device, gather_dtype).finish()


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
def _start_gather(
    entries: list[_Entry], device: torch.device, gather_dtype: torch.dtype | None
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
            batches.setdefault((id(mesh), _gathered_dtype(entry, gather_dtype)), []).append(index)
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


class FSDP2FrozenModel(OffloadableModel):
    """A model sharded with FSDP2 for inference. ``offload`` moves its parameters only."""

    _backend = NAME

    def __init__(
        self,
        module: torch.nn.Module,
        *,
        device: torch.device,
        movable: frozenset[ModelPart],
        host_resident: bool,
    ) -> None:
        """``movable``: the parts the backend declares it can offload; ``host_resident``: FSDP2
        keeps every part on the host (CPUOffloadPolicy), so nothing needs the device."""
        super().__init__(movable=movable, where=Location.HOST if host_resident else Location.DEVICE)
        self._module = module
        self._device = device
        self._host_resident = host_resident
        # Hugging Face names and sharded parameters in module order, listed once, now, while
        # every unit is sharded (later a unit kept gathered after its forward lists its gathered
        # copies instead): walking the wrapped module costs more than a world-1 sync's copies,
        # and FSDP2 keeps these Parameter objects for the module's life (moves and checkpoint
        # loads replace their data in place).
        self._entries = [_entry(hf_name(name), p) for name, p in module.named_parameters()]

    @property
    def module(self) -> torch.nn.Module:
        return self._module

    def full_weights(
        self, bucket_bytes: int, *, gather_dtype: torch.dtype | None = None
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Greedy in-order buckets of gathered parameters, on the device (gathered there even
        while the parameters are offloaded). Collective. With several ranks, floating-point
        parameters are cast to ``gather_dtype`` before the all-gather; on one rank nothing is
        gathered, so nothing is cast (the caller's copy casts for free).

        With several ranks the next bucket's all-gather is issued before a bucket is handed out,
        so it travels while the caller loads this one: at most two buckets are in flight, and
        the largest transient is about two buckets (the one handed out and the next one's
        gather buffers), not one. Every rank must drain the iterator, as ``DirectSync`` does
        even after a failed load, so that all ranks issue the same collectives. An iterator
        closed early (the same bucket on every rank) first waits for the all-gather it already
        issued, which every rank that reached that bucket issued too."""
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
        return self._buckets(bucket_bytes, gather_dtype)

    def _buckets(
        self, bucket_bytes: int, gather_dtype: torch.dtype | None
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        if dist.get_world_size() == 1:
            yield from self._local_buckets(bucket_bytes)
            return
        packed = self._packed(bucket_bytes, gather_dtype)
        first = next(packed, None)
        in_flight = None if first is None else _start_gather(first, self._device, gather_dtype)
        try:
            while in_flight is not None:
                arriving, in_flight = in_flight, None
                bucket = arriving.finish()
                # Its gather buffers go before the next bucket's are allocated, so the caller's
                # bucket and the next one's buffers are all that stays.
                del arriving
                entries = next(packed, None)
                if entries is not None:
                    # Issued now, it runs on the collective's own stream while the caller
                    # copies this bucket on the compute stream.
                    in_flight = _start_gather(entries, self._device, gather_dtype)
                yield bucket
        finally:
            if in_flight is not None:
                # Closed early: complete the collective before its buffers are dropped.
                in_flight.wait()

    def _packed(
        self, bucket_bytes: int, gather_dtype: torch.dtype | None
    ) -> Iterator[list[_Entry]]:
        """The entries of each bucket; sizes come from the global shapes, known before
        gathering."""
        bucket: list[_Entry] = []
        size = 0
        for entry in self._entries:
            nbytes = entry.param.numel() * _gathered_dtype(entry, gather_dtype).itemsize
            if bucket and size + nbytes > bucket_bytes:
                yield bucket
                bucket, size = [], 0
            bucket.append(entry)
            size += nbytes
        if bucket:
            yield bucket

    @torch.no_grad()
    def _local_buckets(self, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """One rank: each shard is the whole tensor, so a bucket is the shards themselves (moved
        to the device if they are on the host). This is the hot loop of a colocated sync on one
        GPU, run once per parameter: it reads ``_local_tensor`` directly, because ``to_local``
        re-wraps the shard as a Parameter view on every call, which costs more than the copy of
        a small tensor."""
        bucket: list[tuple[str, torch.Tensor]] = []
        size = 0
        device = self._device
        for name, param, _, _ in self._entries:
            local = param._local_tensor if isinstance(param, DTensor) else param
            if local.device != device:
                local = local.to(device)
            nbytes = local.numel() * local.element_size()
            if bucket and size + nbytes > bucket_bytes:
                yield bucket
                bucket, size = [], 0
            bucket.append((name, local.detach()))
            size += nbytes
        if bucket:
            yield bucket

    def _destination(self, to_host: bool) -> torch.device:
        return torch.device("cpu") if to_host else self._device

    def _move_part(self, part: ModelPart, *, to_host: bool) -> None:
        assert part is ModelPart.PARAMETERS, part
        # FSDPModule._apply reshards first and re-registers the moved shards with FSDP; the
        # Parameter objects are swapped in place, so the optimizer's references stay valid.
        self._module.to(self._destination(to_host))

    def _require_on_device(self, parts: Collection[ModelPart], action: str) -> None:
        # CPUOffloadPolicy: every part lives on the host and FSDP2 brings it over for each use.
        if not self._host_resident:
            super()._require_on_device(parts, action)


class FSDP2TrainableModel(FSDP2FrozenModel):
    """A model sharded with FSDP2, with AdamW over its shards and a LambdaLR schedule."""

    def __init__(
        self,
        module: torch.nn.Module,
        optimizer: torch.optim.AdamW,
        scheduler: LambdaLR,
        *,
        max_grad_norm: float,
        device: torch.device,
        movable: frozenset[ModelPart],
        host_resident: bool,
        defer_gradient_sync: bool = False,
    ) -> None:
        super().__init__(module, device=device, movable=movable, host_resident=host_resident)
        self._defer_gradient_sync = defer_gradient_sync
        # True between a backward that deferred its reduction and the one that reduces.
        self._unsynced = False
        self._optimizer = optimizer
        self._scheduler = scheduler
        self._max_grad_norm = max_grad_norm
        self._params = [p for group in optimizer.param_groups for p in group["params"]]
        self._steps = 0
        # Gradients set aside while they or their parameters are off the device: a parameter's
        # .grad must live on the parameter's device.
        self._detached_grads: dict[torch.nn.Parameter, torch.Tensor] = {}

    def _parts(self) -> frozenset[ModelPart]:
        return frozenset(ModelPart)

    @property
    def optimizer(self) -> torch.optim.AdamW:
        return self._optimizer

    @property
    def scheduler(self) -> LambdaLR:
        return self._scheduler

    @property
    def optimizer_steps(self) -> int:
        return self._steps

    def backward(self, loss: torch.Tensor, *, sync_gradients: bool = True) -> None:
        self._require_on_device((ModelPart.PARAMETERS, ModelPart.GRADIENTS), "backward")
        defer = self._defer_gradient_sync and not sync_gradients
        module = cast(FSDPModule, self._module)
        # Deferred: gradients accumulate unsharded, unreduced, and the gathered parameters stay
        # for the next micro-batch's forward; the reducing backward reshards as usual.
        module.set_requires_gradient_sync(not defer)
        module.set_reshard_after_backward(not defer)
        torch.autograd.backward(loss)
        self._unsynced = defer

    def _require_synced(self, action: str) -> None:
        if self._unsynced:
            raise RuntimeError(
                f"cannot {action} after backward(sync_gradients=False): the gradients are not "
                "reduced yet; the optimizer step's last backward must pass sync_gradients=True"
            )

    def step(self) -> StepReport:
        self._require_synced("step")
        self._require_on_device(tuple(ModelPart), "step")
        grads = [p.grad for p in self._params if p.grad is not None]
        total_norm = _global_norm(grads, self._device)
        norm = float(total_norm)
        lr = float(self._optimizer.param_groups[0]["lr"])
        if not math.isfinite(norm):
            self._optimizer.zero_grad(set_to_none=True)
            return StepReport(optimizer_steps=self._steps, grad_norm=norm, skipped=True, lr=lr)
        if self._max_grad_norm > 0:
            torch.nn.utils.clip_grads_with_norm_(self._params, self._max_grad_norm, total_norm)
        self._optimizer.step()
        self._scheduler.step()
        self._optimizer.zero_grad(set_to_none=True)
        self._steps += 1
        return StepReport(optimizer_steps=self._steps, grad_norm=norm, skipped=False, lr=lr)

    def save(self, directory: Path) -> None:
        self._require_on_device((ModelPart.PARAMETERS, ModelPart.OPTIMIZER), "save")
        checkpoint.save(
            directory, self._module, self._optimizer, self._scheduler, optimizer_steps=self._steps
        )

    def load(self, directory: Path) -> None:
        self._require_on_device((ModelPart.PARAMETERS, ModelPart.OPTIMIZER), "load")
        self._steps = checkpoint.load(directory, self._module, self._optimizer, self._scheduler)

    def _move_part(self, part: ModelPart, *, to_host: bool) -> None:
        self._require_synced("offload or reload")
        device = self._destination(to_host)
        if part is ModelPart.OPTIMIZER:
            for state in self._optimizer.state.values():
                for key, value in state.items():
                    # The step counter stays where AdamW keeps it (the host, or the
                    # device when fused or capturable): it is not part of the moved state.
                    # DTensor.to moves the local shard and keeps mesh and placements, where
                    # DTensor.from_local would move a host shard back to the mesh's device.
                    if isinstance(value, torch.Tensor) and key != "step":
                        state[key] = value.to(device)
        elif part is ModelPart.GRADIENTS:
            for param, grad in self._detached_grads.items():
                self._detached_grads[param] = grad.to(device)
        else:
            super()._move_part(part, to_host=to_host)

    def _set_aside_gradients(self) -> None:
        # module.to() would otherwise carry .grad along with the parameters.
        for param in self._params:
            if param.grad is not None:
                self._detached_grads[param] = param.grad
                param.grad = None

    def _restore_gradients(self) -> None:
        for param, grad in self._detached_grads.items():
            param.grad = grad
        self._detached_grads.clear()


@torch.no_grad()
def _global_norm(grads: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The 2-norm of all gradients over all ranks; collective when they are sharded DTensors.

    FSDP2 shards every gradient along one mesh dimension, so the squared norms of the local
    shards add up to the squared global norm. Reducing them by hand on the compute device (rather
    than calling vector_norm on the DTensors) also works for host-resident CPUOffloadPolicy
    gradients, whose implicit all-reduce would run NCCL on host memory.
    """
    if not grads:
        return torch.zeros((), device=device)
    first = grads[0]
    if not isinstance(first, DTensor):
        return torch.nn.utils.get_total_norm(grads).to(device)
    shards = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    squared = torch.nn.utils.get_total_norm(shards).to(device).double() ** 2
    dist.all_reduce(squared, group=first.device_mesh.get_group())
    return squared.sqrt().float()
