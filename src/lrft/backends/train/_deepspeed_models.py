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
from lrft.api.types import ModelPart, StepReport
from lrft.backends.train import _deepspeed_memory as memory
from lrft.backends.train._names import hf_name
from lrft.backends.train._placement import OffloadableModel, TrainableParts
from lrft.backends.train._training import barrier

if TYPE_CHECKING:
    from deepspeed.runtime.engine import DeepSpeedEngine

NAME = "deepspeed"
# The tag (sub-folder) DeepSpeed writes its checkpoint files under inside lrft's directory.
CHECKPOINT_TAG = "deepspeed"
_STEPS_KEY = "lrft_optimizer_steps"

NamedParameters = list[tuple[str, torch.nn.Parameter]]


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
def _bucket_copies(named: NamedParameters) -> list[tuple[str, torch.Tensor]]:
    partitioned = [param for _, param in named if is_partitioned(param)]
    if not partitioned:
        # ZeRO-1/2 parameters and plain replicas are whole on every rank already.
        return [(name, param.detach()) for name, param in named]
    from deepspeed.runtime.zero import GatheredParameters

    # Copied inside the context: leaving it releases the gathered storage again.
    with GatheredParameters(partitioned, modifier_rank=None):
        return [(name, param.detach().clone()) for name, param in named]


def gathered_buckets(
    named: NamedParameters, bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Greedy in-order buckets of full tensors, gathering one bucket at a time. Collective."""
    bucket: NamedParameters = []
    size = 0
    for name, param in named:
        # Sized from the full shape before gathering: the previous bucket is handed out (and
        # released) before anything of the next one is materialised.
        nbytes = full_numel(param) * param.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield _bucket_copies(bucket)
            bucket, size = [], 0
        bucket.append((name, param))
        size += nbytes
    if bucket:
        yield _bucket_copies(bucket)


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
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
        named = hf_named_parameters(self._inner)
        if any(is_partitioned(p) for _, p in named):
            self._require_on_device((ModelPart.PARAMETERS,), "full_weights of ZeRO-3 parameters")
        return gathered_buckets(named, bucket_bytes)

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
        self._trained.save_checkpoint(
            directory, tag=CHECKPOINT_TAG, client_state=client_state, save_latest=False
        )
        barrier()

    def load(self, directory: Path) -> None:
        self._require_on_device(tuple(ModelPart), "load")
        if not (directory / CHECKPOINT_TAG).is_dir():
            raise LrftError(f"{directory} is not a deepspeed checkpoint: no {CHECKPOINT_TAG}/")
        path, client_state = self._trained.load_checkpoint(
            directory, tag=CHECKPOINT_TAG, load_optimizer_states=True, load_lr_scheduler_states=True
        )
        if path is None or client_state is None or _STEPS_KEY not in client_state:
            raise LrftError(f"DeepSpeed could not load the checkpoint in {directory}")
        self._steps = int(client_state[_STEPS_KEY])

    def _move_part(self, part: ModelPart, *, to_host: bool) -> None:
        if to_host:
            self._states.offload(part)
        else:
            self._states.reload(part)


def _agreed_skip(skipped: bool, device: torch.device) -> bool:
    """``skipped``, checked to be the same on every rank (DeepSpeed all-reduces the norm and the
    overflow flag, so a disagreement would be a DeepSpeed fault, not a user error)."""
    count = torch.tensor([1.0 if skipped else 0.0], device=device)
    dist.all_reduce(count)
    agreed = int(count.item())
    if agreed not in (0, dist.get_world_size()):
        raise LrftError(f"ranks disagree on skipping the step: {agreed} of {dist.get_world_size()}")
    return skipped
