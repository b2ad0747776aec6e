"""The handles the ``fsdp2`` backend returns: frozen and trainable FSDP2-sharded models."""

from __future__ import annotations

import math
import operator
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import cast

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LambdaLR

from lrft.api.errors import LrftError
from lrft.api.types import Location, ModelPart, StepReport
from lrft.backends.train import _fsdp2_checkpoint as checkpoint
from lrft.backends.train._fsdp2_gather import (
    BucketInFlight,
    BucketPlan,
    Entry,
    entry_of,
    gathered_dtype,
)
from lrft.backends.train._fsdp2_units import UnitGather, UnitWeights
from lrft.backends.train._names import hf_name
from lrft.backends.train._placement import OffloadableModel, TrainableParts, optimizer_moments
from lrft.backends.train._weights_layout import WeightMarks, weights_units

NAME = "fsdp2"

_LOCAL_TENSOR = operator.attrgetter("_local_tensor")
_NBYTES = operator.attrgetter("nbytes")
_REQUIRES_GRAD = operator.attrgetter("requires_grad")


class FSDP2FrozenModel(UnitWeights, OffloadableModel):
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
        super().__init__(
            device=device,
            movable=movable,
            where=Location.HOST if host_resident else Location.DEVICE,
        )
        self._module = module
        self._host_resident = host_resident
        # Hugging Face names and sharded parameters in module order, listed once, now, while
        # every unit is sharded (later a unit kept gathered after its forward lists its gathered
        # copies instead): walking the wrapped module costs more than a world-1 sync's copies,
        # and FSDP2 keeps these Parameter objects for the module's life (moves and checkpoint
        # loads replace their data in place).
        named = list(module.named_parameters())
        self._entries = [entry_of(hf_name(name), p) for name, p in named]
        self._names = [entry.name for entry in self._entries]
        self._sharded = [entry.param for entry in self._entries]
        # What the parameters yield (a LoRA model's merged weights), and which of them vary.
        self._units = weights_units(module, [name for name, _ in named], self._sharded)
        self._merges = any(unit.merged for unit in self._units)
        self._unit_gather = UnitGather(self._entries, device)
        self._marks = WeightMarks(self._units, device)
        self._all_dtensors = all(isinstance(p, DTensor) for p in self._sharded)
        # bucket_bytes, the shards' sizes and the bucket bounds of the last local sync
        self._last_bounds: tuple[int, list[int], list[tuple[int, int]]] | None = None
        # the gather plans of the last bucket_bytes and gather_dtype, with several ranks
        self._gather_plans: tuple[tuple[int, torch.dtype | None], list[BucketPlan]] | None = None
        # a pass over the kept plans is open: a second one would gather into the same buffers
        self._gathering = False

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
        so it travels while the caller loads this one. The largest transient is two buckets
        with their send buffers (``1 / world`` of a bucket each: the bucket about to be handed
        out and the next one, both gathering), never the model: a bucket's memory is freed as soon as the next one is asked for, even
        if the caller still references its tensors (they then hold no storage), and nothing
        stays allocated between calls. How each bucket is gathered (its buffers' views) is
        planned on the first call and kept for later calls with the same ``bucket_bytes`` and
        ``gather_dtype``.

        One pass at a time: with several ranks, a second pass started while one is open (not
        drained or closed) raises ``LrftError``, since both would gather into the same buffers.
        Every rank must drain the iterator, as ``DirectSync`` does even after a failed load, so
        that all ranks issue the same collectives. An iterator closed early (the same bucket on
        every rank) first waits for the all-gather it already issued, which every rank that
        reached that bucket issued too."""
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
        if self._merges:
            return self._unit_buckets("full", self._units, bucket_bytes, gather_dtype)
        return self._buckets(bucket_bytes, gather_dtype)

    def _buckets(
        self, bucket_bytes: int, gather_dtype: torch.dtype | None
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        if dist.get_world_size() == 1:
            yield from self._local_buckets(bucket_bytes)
            return
        if self._gathering:
            raise LrftError(
                "full_weights: another pass over this model's weights is still open; with "
                "several ranks its gather buffers are shared, so drain or close it first"
            )
        plans = self._plans(bucket_bytes, gather_dtype)
        if not plans:
            return
        self._gathering = True
        try:
            yield from self._gathered(plans)
        finally:
            self._gathering = False

    def _gathered(self, plans: list[BucketPlan]) -> Iterator[list[tuple[str, torch.Tensor]]]:
        in_flight: BucketInFlight | None = plans[0].start()
        try:
            for k, plan in enumerate(plans):
                assert in_flight is not None
                arriving = in_flight
                # Issued before this bucket is waited for: the next bucket's cast is then queued
                # ahead of the wait, so its collective follows this one's on the collective's
                # stream with no gap, and travels while the caller copies this bucket on the
                # compute stream.
                in_flight = plans[k + 1].start() if k + 1 < len(plans) else None
                bucket = arriving.finish()
                del arriving
                yield bucket
                # the caller asked for the next bucket: this one's tensors are no longer valid
                plan.release(received=True)
        finally:
            if in_flight is not None:
                # Closed early: complete the collective before its buffers are freed.
                in_flight.wait()
            for plan in plans:
                plan.release(received=True)

    def _plans(self, bucket_bytes: int, gather_dtype: torch.dtype | None) -> list[BucketPlan]:
        """Each bucket's gather plan, made on the first call with these arguments and kept:
        FSDP2 keeps its parameters' shapes, so the buckets and their views stay valid."""
        key = (bucket_bytes, gather_dtype)
        if self._gather_plans is None or self._gather_plans[0] != key:
            plans = [
                BucketPlan(entries, self._device, gather_dtype)
                for entries in self._packed(bucket_bytes, gather_dtype)
            ]
            self._gather_plans = (key, plans)
        return self._gather_plans[1]

    def _packed(self, bucket_bytes: int, gather_dtype: torch.dtype | None) -> Iterator[list[Entry]]:
        """The entries of each bucket; sizes come from the global shapes, known before
        gathering."""
        bucket: list[Entry] = []
        size = 0
        for entry in self._entries:
            nbytes = entry.numel * gathered_dtype(entry, gather_dtype).itemsize
            if bucket and size + nbytes > bucket_bytes:
                yield bucket
                bucket, size = [], 0
            bucket.append(entry)
            size += nbytes
        if bucket:
            yield bucket

    def _local_buckets(self, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """One rank: each shard is the whole tensor, so a bucket is the shards themselves (moved
        to the device if they are on the host, a bucket at a time). This is the hot path of a
        colocated sync on one GPU, where a small model's copies take less time than a Python
        loop over its parameters: each property of every shard is read with one C call
        (``map``), ``_local_tensor`` is read directly (``to_local`` re-wraps the shard as a
        Parameter view on every call), and the bounds of the last call are kept and checked
        bucket by bucket, so that the first bucket goes out before the rest are looked at.
        (No ``no_grad`` context per step of the generator: a shard that requires grad, if any,
        is detached after its move.)"""
        known = self._last_bounds
        if known is None or known[0] != bucket_bytes:
            known = self._plan_bounds(bucket_bytes, [], [])
        k = 0
        while k < len(known[2]):
            first, end = known[2][k]
            shards = self._shards(first, end)
            if list(map(_NBYTES, shards)) != known[1][first:end]:
                # sizes changed since: the bounds again, from this bucket on
                known = self._plan_bounds(bucket_bytes, known[1][:first], known[2][:k])
                first, end = known[2][k]
                shards = self._shards(first, end)
            yield self._bucket(first, shards)
            k += 1

    def _shards(self, first: int, end: int) -> list[torch.Tensor]:
        params = self._sharded[first:end]
        if self._all_dtensors:
            return list(map(_LOCAL_TENSOR, params))
        return [p._local_tensor if isinstance(p, DTensor) else p for p in params]

    def _bucket(self, first: int, shards: list[torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
        index = self._device.index if self._device.type == "cuda" else -1
        if list(map(torch.Tensor.get_device, shards)).count(index) != len(shards):
            shards = [s if s.get_device() == index else s.to(self._device) for s in shards]
        # FSDP2's shards do not require grad: the aliases are handed out as they are
        if any(map(_REQUIRES_GRAD, shards)):
            shards = [s.detach() for s in shards]
        return list(zip(self._names[first : first + len(shards)], shards, strict=True))

    def _plan_bounds(
        self, bucket_bytes: int, sizes: list[int], bounds: list[tuple[int, int]]
    ) -> tuple[int, list[int], list[tuple[int, int]]]:
        """Greedy in-order bounds ``(first, end)`` of buckets: ``bounds`` (those of the shards
        ``sizes`` gives), then the rest, by the sizes the shards have now."""
        start = len(sizes)
        sizes = sizes + list(map(_NBYTES, self._shards(start, len(self._sharded))))
        bounds = list(bounds)
        size = 0
        for i in range(start, len(sizes)):
            if i > start and size + sizes[i] > bucket_bytes:
                bounds.append((start, i))
                start, size = i, 0
            size += sizes[i]
        if start < len(sizes):
            bounds.append((start, len(sizes)))
        self._last_bounds = (bucket_bytes, sizes, bounds)
        return self._last_bounds

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


class FSDP2TrainableModel(TrainableParts, FSDP2FrozenModel):
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

    @property
    def optimizer(self) -> torch.optim.AdamW:
        return self._optimizer

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
        if part is ModelPart.OPTIMIZER:
            device = self._destination(to_host)
            for state, key, value in optimizer_moments(self._optimizer):
                # DTensor.to moves the local shard and keeps mesh and placements, where
                # DTensor.from_local would move a host shard back to the mesh's device.
                state[key] = value.to(device)
        elif part is ModelPart.PARAMETERS:
            super()._move_part(part, to_host=to_host)
        # The gradients are only those set aside, which the base moves.


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
