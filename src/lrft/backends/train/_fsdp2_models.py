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
    return _gather_entries([_entry(name, p) for name, p in named], device, gather_dtype)


@torch.no_grad()
def _gather_entries(
    entries: list[_Entry], device: torch.device, gather_dtype: torch.dtype | None
) -> list[tuple[str, torch.Tensor]]:
    if gather_dtype is not None and not gather_dtype.is_floating_point:
        gather_dtype = None
    full: list[torch.Tensor | None] = [None] * len(entries)
    batches: dict[tuple[int, torch.dtype], list[int]] = {}
    for index, entry in enumerate(entries):
        if entry.mesh_ranks:
            mesh = cast(DTensor, entry.param).device_mesh
            batches.setdefault((id(mesh), _gathered_dtype(entry, gather_dtype)), []).append(index)
        else:
            full[index] = _full_tensor(entry.param, device)
    for (_, dtype), indices in batches.items():
        gathered = _gather_rows([entries[i].param for i in indices], device, dtype)
        for index, tensor in zip(indices, gathered, strict=True):
            full[index] = tensor
    return [
        (entry.name, tensor)
        for entry, tensor in zip(entries, full, strict=True)
        if tensor is not None
    ]


def _gather_rows(
    params: list[torch.Tensor], device: torch.device, dtype: torch.dtype
) -> list[torch.Tensor]:
    """One ``all_gather_into_tensor`` of every row-sharded parameter in ``params`` (one mesh),
    in ``dtype``: each rank's shard is cast into a flat buffer, padded to ``ceil(rows / world)``
    rows. On one rank the shards are returned as they are."""
    first = params[0]
    assert isinstance(first, DTensor)
    mesh = first.device_mesh
    world = mesh.size()
    # _local_tensor: to_local() re-wraps each shard as a Parameter view, per parameter per sync
    shards = [p._local_tensor if isinstance(p, DTensor) else p for p in params]
    if world == 1:
        return [shard.detach().to(device) for shard in shards]
    rows = [-(-p.shape[0] // world) for p in params]
    widths = [r * math.prod(p.shape[1:]) for r, p in zip(rows, params, strict=True)]
    send = torch.zeros(sum(widths), dtype=dtype, device=device)
    # one fused copy (and cast) of every shard into its slot (padding rows stay zero)
    slots = send.split_with_sizes(widths)
    torch._foreach_copy_(
        [slot[: s.numel()] for slot, s in zip(slots, shards, strict=True)],
        [s.detach().reshape(-1) for s in shards],
    )
    received = torch.empty(world * send.numel(), dtype=dtype, device=device)
    all_gather_into(received, send, group=mesh.get_group())
    blocks = received.view(world, send.numel()).split_with_sizes(widths, dim=1)
    # each parameter's rank-major blocks, made contiguous (a copy), padding rows cut off
    return [
        block.reshape(world * r, *param.shape[1:])[: param.shape[0]]
        for param, r, block in zip(params, rows, blocks, strict=True)
    ]


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
        gathered, so nothing is cast (the caller's copy casts for free)."""
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
        return self._buckets(bucket_bytes, gather_dtype)

    def _buckets(
        self, bucket_bytes: int, gather_dtype: torch.dtype | None
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        if dist.get_world_size() == 1:
            yield from self._local_buckets(bucket_bytes)
            return
        bucket: list[_Entry] = []
        size = 0
        for entry in self._entries:
            # The size is known from the global shape before gathering, so the previous bucket
            # is handed out (and can be released) before the next one is materialised.
            nbytes = entry.param.numel() * _gathered_dtype(entry, gather_dtype).itemsize
            if bucket and size + nbytes > bucket_bytes:
                yield _gather_entries(bucket, self._device, gather_dtype)
                bucket, size = [], 0
            bucket.append(entry)
            size += nbytes
        if bucket:
            yield _gather_entries(bucket, self._device, gather_dtype)

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
