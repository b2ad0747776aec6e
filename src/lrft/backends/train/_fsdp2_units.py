"""An FSDP2 model's weights gathered unit by unit (``_weights_layout.Unit``): the path of a LoRA
model's merged weights, of the varying weights alone (``IncrementalWeightSource``), and of a
LoRA model's base weights.

A bucket holds whole units: an adapted module's base weight travels with its ``lora_A`` and
``lora_B`` and is merged once gathered. Those three are gathered in their own dtype (the merge is
exact in the parameters' precision) and the merged weight is then cast to ``gather_dtype``;
the other weights are cast before the all-gather, as on the plain path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from lrft.api.errors import LrftError
from lrft.api.types import WeightsMark, WeightsUpdate
from lrft.backends.train._fsdp2_gather import BucketPlan, Entry, gather_full
from lrft.backends.train._weights_layout import Unit, WeightMarks, pack_units, unit_tensor

Bucket = list[tuple[str, torch.Tensor]]
Gathered = Callable[[list[BucketPlan]], Iterator[Bucket]]


class UnitGather:
    """Buckets of whole units of one FSDP2 model, with the gather plans of each selection of
    units kept (FSDP2 keeps its parameters' shapes, so the plans stay valid)."""

    def __init__(self, entries: Sequence[Entry], device: torch.device) -> None:
        self._entries = list(entries)
        self._device = device
        self._plans: dict[tuple[str, int, torch.dtype | None], list[list[Unit]]] = {}
        self._gather_plans: dict[tuple[str, int, torch.dtype | None], list[BucketPlan]] = {}

    def _yielded_dtype(self, unit: Unit, gather_dtype: torch.dtype | None) -> torch.dtype:
        entry = self._entries[unit.sources[0]]
        castable = gather_dtype is not None and gather_dtype.is_floating_point and entry.floating
        gathered = entry.mesh_ranks > 1 or (unit.merged and dist.get_world_size() > 1)
        if castable and gathered:
            assert gather_dtype is not None
            return gather_dtype
        return entry.param.dtype

    def _buckets(
        self, key: tuple[str, int, torch.dtype | None], units: Sequence[Unit]
    ) -> list[list[Unit]]:
        if key not in self._plans:
            _, bucket_bytes, gather_dtype = key
            sizes = [
                self._entries[u.sources[0]].numel * self._yielded_dtype(u, gather_dtype).itemsize
                for u in units
            ]
            self._plans[key] = pack_units(units, sizes, bucket_bytes)
        return self._plans[key]

    def buckets(
        self,
        selection: str,
        units: Sequence[Unit],
        bucket_bytes: int,
        gather_dtype: torch.dtype | None,
        gathered: Gathered,
    ) -> Iterator[Bucket]:
        """Greedy in-order buckets of ``units`` (named ``selection``, the key its plans are
        kept under). Collective. ``gathered`` runs the plans of several ranks (the model's
        pipelined pass over them)."""
        key = (selection, bucket_bytes, gather_dtype)
        buckets = self._buckets(key, units)
        if dist.get_world_size() == 1:
            for bucket in buckets:
                yield [(unit.name, self._local_unit(unit)) for unit in bucket]
            return
        if key not in self._gather_plans:
            self._gather_plans[key] = [self._plan(bucket, gather_dtype) for bucket in buckets]
        for bucket, raw in zip(buckets, gathered(self._gather_plans[key]), strict=True):
            yield self._outputs(bucket, [tensor for _, tensor in raw], gather_dtype)

    def _plan(self, bucket: list[Unit], gather_dtype: torch.dtype | None) -> BucketPlan:
        entries = [
            self._entries[i]._replace(cast=not unit.merged) for unit in bucket for i in unit.sources
        ]
        return BucketPlan(entries, self._device, gather_dtype)

    def _outputs(
        self, bucket: list[Unit], full: list[torch.Tensor], gather_dtype: torch.dtype | None
    ) -> Bucket:
        out: Bucket = []
        start = 0
        for unit in bucket:
            sources = full[start : start + len(unit.sources)]
            start += len(unit.sources)
            tensor = unit_tensor(unit, sources)
            if unit.merged:
                tensor = tensor.to(self._yielded_dtype(unit, gather_dtype))
            out.append((unit.name, tensor))
        return out

    @torch.no_grad()
    def _local_unit(self, unit: Unit) -> torch.Tensor:
        """One rank: each shard is the whole tensor (moved to the device if it is on the host)."""
        full = []
        for i in unit.sources:
            param = self._entries[i].param
            local = param._local_tensor if isinstance(param, DTensor) else param
            full.append(local.detach().to(self._device))
        return unit_tensor(unit, full)


class UnitWeights:
    """What an FSDP2 handle gives unit by unit: ``IncrementalWeightSource`` (the varying weights
    and the mark), a LoRA model's base weights and its trainable parameters. Mixed into
    ``FSDP2FrozenModel``, which sets these attributes and runs the pipelined pass."""

    _units: list[Unit]
    _sharded: list[torch.Tensor]
    _marks: WeightMarks
    _unit_gather: UnitGather
    _gathering: bool
    _module: torch.nn.Module
    _device: torch.device

    def _gathered(self, plans: list[BucketPlan]) -> Iterator[Bucket]:
        raise NotImplementedError

    def weights_mark(self, held: WeightsMark | None) -> WeightsUpdate:
        """Fingerprints this rank's shards of the frozen weights' parameters (collective when
        there are any)."""
        frozen = [
            self._local(self._sharded[i])
            for unit in self._units
            if not unit.varying
            for i in unit.sources
        ]
        return self._marks.update(held, frozen)

    def varying_weights(
        self, bucket_bytes: int, *, gather_dtype: torch.dtype | None = None
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
        units = [unit for unit in self._units if unit.varying]
        return self._unit_buckets("varying", units, bucket_bytes, gather_dtype)

    def base_weights(
        self, bucket_bytes: int, *, gather_dtype: torch.dtype | None = None
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """``full_weights`` with every LoRA adapter left out (the base model's weights)."""
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
        units = [Unit(name=unit.name, sources=unit.sources[:1]) for unit in self._units]
        return self._unit_buckets("base", units, bucket_bytes, gather_dtype)

    @torch.no_grad()
    def trainable_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter that requires grad, gathered to its full shape, on the host, in the
        module's own names (a peft model's adapter names). Collective."""
        named: list[tuple[str, torch.Tensor]] = [
            (name, param) for name, param in self._module.named_parameters() if param.requires_grad
        ]
        full = gather_full(named, self._device)
        return {name: tensor.to("cpu", copy=True) for name, tensor in full}

    def _unit_buckets(
        self,
        selection: str,
        units: list[Unit],
        bucket_bytes: int,
        gather_dtype: torch.dtype | None,
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        if self._gathering:
            raise LrftError(
                "full_weights: another pass over this model's weights is still open; with "
                "several ranks its gather buffers are shared, so drain or close it first"
            )
        yield from self._unit_gather.buckets(
            selection, units, bucket_bytes, gather_dtype, self._pass
        )

    def _pass(self, plans: list[BucketPlan]) -> Iterator[list[tuple[str, torch.Tensor]]]:
        self._gathering = True
        try:
            yield from self._gathered(plans)
        finally:
            self._gathering = False

    @staticmethod
    def _local(param: torch.Tensor) -> torch.Tensor:
        return param._local_tensor if isinstance(param, DTensor) else param
