"""Moving a DeepSpeed model's memory between the device and the host, part by part.

lrft's parts map onto DeepSpeed's states (``OffloadStateTypeEnum``) as follows:

- parameters: ``lp_params``, the (bf16 or fp32) model parameters, or this rank's ZeRO-3 shards;
- gradients: ``lp_grads``, the reduced gradient partitions (ZeRO-3 also its
  ``contiguous_grad_buffer``), and any ``param.grad`` still waiting to be reduced (ZeRO-1
  accumulates there until ``step()``);
- optimizer: AdamW's moments and the fp32 master partition (``hp_params``), which only the
  optimizer step reads.

ZeRO-2 does not offload gradients: between backward and ``step()`` they sit in its contiguous
partition buffer and accumulation lists, which DeepSpeed 0.19.8's ``lp_grads`` offload does not
move (nor does it move that buffer between steps), so ``offload_gradients`` is declared for
stages 1 and 3 only.

``engine.offload_states`` moves what it can; DeepSpeed 0.19.8 leaves gaps that lrft fills with
explicit moves:

- ``reload_states`` reloads everything that is offloaded: lrft hides the states it means to leave
  on the host from the optimizer's ``offloaded_states`` while calling it;
- ZeRO-3 refuses to offload optimizer states and master weights unless the optimizer is
  DeepSpeed's FusedAdam: lrft moves the flat fp32 partitions itself, swapping ``.data`` so that
  AdamW's state stays keyed by the same tensors;
- its optimizer-state offload also moves AdamW's ``step`` counters, which torch keeps on the host,
  to the device on reload: lrft moves the moments itself and leaves ``step`` alone;
- ZeRO-3's ``lp_params`` offload re-points every parameter of the module into the flat buffer of
  the trained ones, which with frozen parameters (a LoRA model's base) overruns it: lrft then
  offloads that buffer itself, as DeepSpeed would for the trained parameters alone (its reload is
  right), and moves the frozen parameters' shards one by one.

Every tensor lrft moves keeps its identity (its ``.data`` is swapped, as DeepSpeed does for
``exp_avg``/``exp_avg_sq``): a moment replaced by a host copy in AdamW's state dict would stay on
the device as long as anything else still referenced the old tensor, and reload would then put a
second copy beside it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from lrft.api.errors import LrftError
from lrft.api.types import ModelPart
from lrft.backends.train._placement import optimizer_moments

if TYPE_CHECKING:
    from deepspeed.runtime.engine import DeepSpeedEngine
    from deepspeed.runtime.zero.offload_config import OffloadStateTypeEnum

_HOST = torch.device("cpu")


def movable_parts(zero_stage: int) -> frozenset[ModelPart]:
    """The parts ``offload``/``reload`` really move at ``zero_stage`` (see the module notes)."""
    if zero_stage == 2:
        return frozenset({ModelPart.PARAMETERS, ModelPart.OPTIMIZER})
    return frozenset(ModelPart)


def _shard(param: torch.nn.Parameter) -> torch.Tensor:
    shard = getattr(param, "ds_tensor", None)
    if not isinstance(shard, torch.Tensor):
        raise LrftError(f"a ZeRO-3 parameter of shape {tuple(param.shape)} has no ds_tensor")
    return shard


def _move_storage(tensor: torch.Tensor, target: torch.device) -> None:
    """Move ``tensor``'s storage to ``target``, keeping the tensor object.

    Replacing the tensor instead (``state[key] = value.to(target)``) leaves every other reference
    to it (an optimizer state dict being saved, a caller's list of moments) holding the device
    copy: offload then frees nothing of it, and reload allocates a second one beside it.
    """
    tensor.data = tensor.data.to(target)


def move_partitions(engine: DeepSpeedEngine, module: torch.nn.Module, target: torch.device) -> None:
    """Move this rank's ZeRO-3 shards of a model without an optimizer (inference) to ``target``.

    Gathered copies (persistent small parameters, leftovers of a forward) are released first,
    so nothing of the model stays on the device; the next forward gathers what it needs.
    """
    if target.type == _HOST.type:
        engine.empty_partition_cache()
    for param in module.parameters():
        shard = _shard(param)
        shard.data = shard.data.to(target)


class TrainStates:
    """The memory of one trainable engine: its ZeRO optimizer's buffers and partitions (the
    gradients still waiting in ``param.grad`` are set aside and moved by the model's
    ``OffloadableModel`` bookkeeping)."""

    def __init__(self, engine: DeepSpeedEngine, device: torch.device) -> None:
        from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
        from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

        zero = engine.optimizer
        if not isinstance(zero, DeepSpeedZeroOptimizer | DeepSpeedZeroOptimizer_Stage3):
            raise LrftError(f"expected a ZeRO optimizer in the engine, found {type(zero).__name__}")
        self._engine = engine
        self._zero = zero
        self._device = device
        # Master weights the engine cannot move itself (ZeRO-3); ZeRO-1/2 move hp_params.
        self._own_masters = (
            list(zero.fp32_partitioned_groups_flat)
            if isinstance(zero, DeepSpeedZeroOptimizer_Stage3)
            else []
        )
        self._stage3 = isinstance(zero, DeepSpeedZeroOptimizer_Stage3)
        self._pending_stage3_grads = False
        self._frozen = [p for p in engine.module.parameters() if not p.requires_grad]

    @property
    def inner_optimizer(self) -> torch.optim.Optimizer:
        return self._zero.optimizer

    def _engine_states(self, part: ModelPart) -> list[OffloadStateTypeEnum]:
        from deepspeed.runtime.zero.offload_config import OffloadStateTypeEnum as State

        if part is ModelPart.PARAMETERS:
            return [State.lp_params]
        if part is ModelPart.GRADIENTS:
            return (
                [State.lp_grads, State.contiguous_grad_buffer] if self._stage3 else [State.lp_grads]
            )
        return [] if self._stage3 else [State.hp_params]

    def offload(self, part: ModelPart) -> None:
        from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum

        if part is ModelPart.GRADIENTS and self._stage3:
            # Gradients accumulated since the last step(), which the offload below unlinks.
            pending = self._zero.averaged_gradients.values()
            self._pending_stage3_grads = any(grads is not None for grads in pending)
        self._move_own(part, _HOST)
        states = self._engine_states(part)
        if part is ModelPart.PARAMETERS and self._stage3 and self._frozen:
            self._offload_stage3_parameters()
            return
        if states:
            # Pinned host memory needs an accelerator.
            pin = self._device.type == "cuda"
            self._engine.offload_states(
                include=states, device=OffloadDeviceEnum.cpu, pin_memory=pin, non_blocking=False
            )

    def reload(self, part: ModelPart) -> None:
        states = self._engine_states(part)
        if states:
            offloaded = self._zero.offloaded_states
            elsewhere = offloaded - set(states)
            offloaded.difference_update(elsewhere)  # reload_states reloads all it finds here
            try:
                self._engine.reload_states(non_blocking=False)
            finally:
                offloaded.update(elsewhere)
        self._move_own(part, self._device)
        if part is ModelPart.GRADIENTS and self._pending_stage3_grads:
            self._relink_stage3_grads()

    def _offload_stage3_parameters(self) -> None:
        """DeepSpeed 0.19.8's ``lp_params`` offload for a model with frozen parameters (see
        the module notes); its ``reload_states`` brings the flat buffer back."""
        from deepspeed.runtime.zero.offload_config import OffloadStateTypeEnum
        from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
        from deepspeed.runtime.zero.utils import get_mapping_to_flat_buffer

        zero = self._zero
        assert isinstance(zero, DeepSpeedZeroOptimizer_Stage3)
        host = zero.lp_param_buffer.to(_HOST)
        if self._device.type == "cuda":
            host = host.pin_memory()
        zero.lp_param_buffer.data = host
        for tensor, offset, numel in get_mapping_to_flat_buffer(zero._get_parameter_partitions()):
            tensor.data = host.narrow(0, offset, numel)
        zero.fp16_partitioned_groups_flat.clear()
        zero.offloaded_states.add(OffloadStateTypeEnum.lp_params)

    def _relink_stage3_grads(self) -> None:
        from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

        # ZeRO-3's lp_grads reload re-points each parameter's slot in the flat gradient buffer
        # but empties the per-group lists step() reads, which its backward epilogue rebuilds from
        # those slots; with nothing left to reduce, that rebuild is all the epilogue does.
        assert isinstance(self._zero, DeepSpeedZeroOptimizer_Stage3)
        self._zero.independent_gradient_partition_epilogue()
        self._pending_stage3_grads = False

    def _move_own(self, part: ModelPart, target: torch.device) -> None:
        if part is ModelPart.PARAMETERS and self._stage3:
            for param in self._frozen:
                shard = _shard(param)
                shard.data = shard.data.to(target)
        if part is ModelPart.OPTIMIZER:
            for _, _, value in optimizer_moments(self.inner_optimizer):
                _move_storage(value, target)
            for master in self._own_masters:
                _move_storage(master, target)
