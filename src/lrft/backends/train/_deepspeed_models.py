"""The handles the ``deepspeed`` backend returns: frozen and trainable models.

Their methods run only once the backend has imported deepspeed; imports of it stay inside
functions, so that importing this module (``lrft.backends.train.deepspeed`` does) never needs it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.optim.lr_scheduler import LambdaLR

from lrft.api.errors import LrftError
from lrft.api.types import ModelPart, StepReport, WeightsMark, WeightsUpdate
from lrft.backends.train import _deepspeed_memory as memory
from lrft.backends.train._names import hf_name
from lrft.backends.train._placement import OffloadableModel, TrainableParts
from lrft.backends.train._training import barrier
from lrft.backends.train._weights_layout import (
    Unit,
    WeightMarks,
    pack_units,
    unit_tensor,
    weights_units,
)

if TYPE_CHECKING:
    from deepspeed.runtime.engine import DeepSpeedEngine

NAME = "deepspeed"
# The tag (sub-folder) DeepSpeed writes its checkpoint files under inside lrft's directory.
CHECKPOINT_TAG = "deepspeed"
_STEPS_KEY = "lrft_optimizer_steps"

NamedParameters = list[tuple[str, torch.nn.Parameter]]
Bucket = list[tuple[str, torch.Tensor]]


def full_numel(param: torch.nn.Parameter) -> int:
    """The element count at full shape: a ZeRO-3 parameter's own tensor is empty between uses."""
    numel = getattr(param, "ds_numel", None)
    return int(numel) if numel is not None else param.numel()


def is_partitioned(param: torch.nn.Parameter) -> bool:
    """Whether ZeRO-3 partitions ``param`` (it then carries ``ds_tensor``, this rank's shard)."""
    return hasattr(param, "ds_id")


def hf_named_parameters(module: torch.nn.Module) -> NamedParameters:
    """The parameters of the wrapped model (not of the engine, which prefixes ``module.``) in
    Hugging Face names; tied parameters once, as ``named_parameters()`` gives them."""
    return [(hf_name(name), param) for name, param in module.named_parameters()]


@torch.no_grad()
def _unit_copies(bucket: list[Unit], params: list[torch.nn.Parameter]) -> Bucket:
    """The weights of ``bucket``'s units, gathering their partitioned parameters at once."""
    partitioned = [params[i] for unit in bucket for i in unit.sources if is_partitioned(params[i])]
    if not partitioned:
        # ZeRO-1/2 parameters and plain replicas are whole on every rank already.
        return [(u.name, unit_tensor(u, [params[i].detach() for i in u.sources])) for u in bucket]
    from deepspeed.runtime.zero import GatheredParameters

    # Copied inside the context: leaving it releases the gathered storage again (a merged
    # weight is a new tensor already).
    with GatheredParameters(partitioned, modifier_rank=None):
        out = []
        for unit in bucket:
            tensor = unit_tensor(unit, [params[i].detach() for i in unit.sources])
            out.append((unit.name, tensor if unit.merged else tensor.clone()))
        return out


def gathered_buckets(
    units: list[Unit], params: list[torch.nn.Parameter], bucket_bytes: int
) -> Iterator[Bucket]:
    """Greedy in-order buckets of the units' weights, gathering one bucket at a time.
    Collective."""
    # Sized from the full shape before gathering: the previous bucket is handed out (and
    # released) before anything of the next one is materialised.
    sizes = [full_numel(params[u.sources[0]]) * params[u.sources[0]].element_size() for u in units]
    for bucket in pack_units(units, sizes, bucket_bytes):
        yield _unit_copies(bucket, params)


class DeepSpeedFrozenModel(OffloadableModel):
    """A model for inference: partitioned by a ZeRO-3 inference engine, or a plain replica.

    ``offload`` moves its parameters only: a ZeRO-3 model's shards, or the whole replica.
    """

    _backend = NAME

    def __init__(
        self,
        module: torch.nn.Module,
        *,
        engine: DeepSpeedEngine | None,
        device: torch.device,
        movable: frozenset[ModelPart],
    ) -> None:
        """``module`` is the user's model; ``engine`` wraps it when ZeRO partitions it."""
        super().__init__(device=device, movable=movable)
        self._inner = module
        self._engine = engine
        named = list(module.named_parameters())
        self._all_params = [param for _, param in named]
        # What the parameters yield (a LoRA model's merged weights), and which of them vary.
        self._units = weights_units(module, [name for name, _ in named], self._all_params)
        self._marks = WeightMarks(self._units, device)

    @property
    def module(self) -> torch.nn.Module:
        """The engine where there is one (its forward is DeepSpeed's entry point), else the model."""
        return self._engine if self._engine is not None else self._inner

    @property
    def engine(self) -> DeepSpeedEngine | None:
        """The DeepSpeed engine wrapping the model, ``None`` for a plain replica."""
        return self._engine

    def full_weights(
        self, bucket_bytes: int, *, gather_dtype: torch.dtype | None = None
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Greedy in-order buckets of full tensors in Hugging Face names. Collective. ZeRO-3
        gathers one bucket at a time, on the device: partitioned parameters must be there.
        ``gather_dtype`` is not used: ZeRO-3 gathers its partitions in their own dtype (bf16 on
        CUDA already), and the other stages hold whole parameters."""
        del gather_dtype
        return self._weights(self._units, bucket_bytes)

    def _weights(self, units: list[Unit], bucket_bytes: int) -> Iterator[Bucket]:
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
        if any(is_partitioned(p) for p in self._all_params):
            self._require_on_device((ModelPart.PARAMETERS,), "full_weights of ZeRO-3 parameters")
        return gathered_buckets(units, self._all_params, bucket_bytes)

    # --- IncrementalWeightSource, and the LoRA model's other weights --------------------------

    def weights_mark(self, held: WeightsMark | None) -> WeightsUpdate:
        """Fingerprints this rank's partitions (or whole replicas) of the frozen weights'
        parameters (collective when there are any)."""
        frozen = [
            _local(self._all_params[i])
            for unit in self._units
            if not unit.varying
            for i in unit.sources
        ]
        return self._marks.update(held, frozen)

    def varying_weights(
        self, bucket_bytes: int, *, gather_dtype: torch.dtype | None = None
    ) -> Iterator[Bucket]:
        del gather_dtype
        return self._weights([unit for unit in self._units if unit.varying], bucket_bytes)

    def base_weights(
        self, bucket_bytes: int, *, gather_dtype: torch.dtype | None = None
    ) -> Iterator[Bucket]:
        """``full_weights`` with every LoRA adapter left out (the base model's weights)."""
        del gather_dtype
        units = [Unit(name=unit.name, sources=unit.sources[:1]) for unit in self._units]
        return self._weights(units, bucket_bytes)

    @torch.no_grad()
    def trainable_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter that requires grad, gathered to its full shape, on the host, in the
        module's own names (a peft model's adapter names). Collective."""
        named = [(name, p) for name, p in self._inner.named_parameters() if p.requires_grad]
        partitioned = [p for _, p in named if is_partitioned(p)]
        if not partitioned:
            return {name: p.detach().to("cpu", copy=True) for name, p in named}
        from deepspeed.runtime.zero import GatheredParameters

        with GatheredParameters(partitioned, modifier_rank=None):
            return {name: p.detach().to("cpu", copy=True) for name, p in named}

    def _move_part(self, part: ModelPart, *, to_host: bool) -> None:
        assert part is ModelPart.PARAMETERS, part
        target = torch.device("cpu") if to_host else self._device
        if self._engine is None:
            self._inner.to(target)
        else:
            memory.move_partitions(self._engine, self._inner, target)


class DeepSpeedTrainableModel(TrainableParts, DeepSpeedFrozenModel):
    """A model wrapped by a DeepSpeed ZeRO engine, with torch AdamW inside its ZeRO optimizer and
    a LambdaLR schedule. The engine's ``step()`` is the accumulation boundary."""

    def __init__(
        self,
        module: torch.nn.Module,
        engine: DeepSpeedEngine,
        scheduler: LambdaLR,
        *,
        device: torch.device,
        movable: frozenset[ModelPart],
    ) -> None:
        super().__init__(module, engine=engine, device=device, movable=movable)
        self._trained = engine
        self._scheduler = scheduler
        self._states = memory.TrainStates(engine, device)
        self._params = [p for p in engine.module.parameters() if p.requires_grad]
        self._steps = 0

    @property
    def engine(self) -> DeepSpeedEngine:
        return self._trained

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The torch AdamW that the ZeRO optimizer steps over this rank's flat fp32 partitions."""
        return self._states.inner_optimizer

    def backward(self, loss: torch.Tensor, *, sync_gradients: bool = True) -> None:
        # sync_gradients is a hint DeepSpeed does not need: its reduction follows its own
        # stage's rules, and step() is the boundary either way.
        del sync_gradients
        self._require_on_device((ModelPart.PARAMETERS, ModelPart.GRADIENTS), "backward")
        # The config has gradient_accumulation_steps=1 and scale_wrt_gas=False: nothing divides
        # the loss; DeepSpeed only accumulates until step().
        self._trained.backward(loss, scale_wrt_gas=False)

    def step(self) -> StepReport:
        """DeepSpeed reduces the accumulated gradients, takes the global norm over every rank's
        partition, skips the step when it is not finite (no parameter, moment or schedule
        change; gradients cleared), else clips and steps AdamW and the schedule."""
        self._require_on_device(tuple(ModelPart), "step")
        lr = float(self._trained.get_lr()[0])
        self._trained.step()
        norm = self._trained.get_global_grad_norm()
        if norm is None:
            raise LrftError("DeepSpeed computed no gradient norm (zero compute_grad_norm is off)")
        grad_norm = float(norm)
        skipped = _agreed_skip(not self._trained.was_step_applied(), self._device)
        if not skipped:
            self._steps += 1
        return StepReport(optimizer_steps=self._steps, grad_norm=grad_norm, skipped=skipped, lr=lr)

    def save(self, directory: Path) -> None:
        self._require_on_device(tuple(ModelPart), "save")
        directory.mkdir(parents=True, exist_ok=True)
        client_state = {_STEPS_KEY: self._steps}
        # Frozen parameters (a LoRA model's base) come from the pretrained weights.
        self._trained.save_checkpoint(
            directory,
            tag=CHECKPOINT_TAG,
            client_state=client_state,
            save_latest=False,
            exclude_frozen_parameters=True,
        )
        barrier()

    def load(self, directory: Path) -> None:
        self._require_on_device(tuple(ModelPart), "load")
        if not (directory / CHECKPOINT_TAG).is_dir():
            raise LrftError(f"{directory} is not a deepspeed checkpoint: no {CHECKPOINT_TAG}/")
        # Not strict: the checkpoint holds no frozen parameters, which keep their values.
        path, client_state = self._trained.load_checkpoint(
            directory,
            tag=CHECKPOINT_TAG,
            load_module_strict=False,
            load_optimizer_states=True,
            load_lr_scheduler_states=True,
        )
        if path is None or client_state is None or _STEPS_KEY not in client_state:
            raise LrftError(f"DeepSpeed could not load the checkpoint in {directory}")
        self._steps = int(client_state[_STEPS_KEY])

    def _move_part(self, part: ModelPart, *, to_host: bool) -> None:
        if to_host:
            self._states.offload(part)
        else:
            self._states.reload(part)


def _local(param: torch.nn.Parameter) -> torch.Tensor:
    """This rank's own storage of ``param``: its ZeRO-3 partition, or the whole tensor."""
    shard = getattr(param, "ds_tensor", None)
    return shard if isinstance(shard, torch.Tensor) else param


def _agreed_skip(skipped: bool, device: torch.device) -> bool:
    """``skipped``, checked to be the same on every rank (DeepSpeed all-reduces the norm and the
    overflow flag, so a disagreement would be a DeepSpeed fault, not a user error)."""
    count = torch.tensor([1.0 if skipped else 0.0], device=device)
    dist.all_reduce(count)
    agreed = int(count.item())
    if agreed not in (0, dist.get_world_size()):
        raise LrftError(f"ranks disagree on skipping the step: {agreed} of {dist.get_world_size()}")
    return skipped
