"""The ``fsdp2`` TrainBackend: torch's ``fully_shard`` on every decoder layer, then on the root.

Each decoder layer (found through the model's ``_no_split_modules`` class names) is one FSDP2
unit, the root holds the rest (embeddings, final norm, head). Parameters stay DTensors sharded
over the whole default process group; gradients are reduce-scattered and averaged over the ranks.
On CUDA the forward and backward compute in bf16 with fp32 gradient reduction (parameters and
AdamW state stay fp32); on CPU everything is fp32.
"""

from __future__ import annotations

import warnings
from typing import TypedDict

import attrs
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)

from lrft.api.capabilities import TrainCapabilities
from lrft.api.optim import OptimizerConfig, SchedulerConfig
from lrft.api.types import ModelPart
from lrft.backends.train._fsdp2_models import NAME, FSDP2FrozenModel, FSDP2TrainableModel
from lrft.backends.train._names import hf_name
from lrft.backends.train._placement import PlacedBackend
from lrft.backends.train._training import adamw_with_schedule

__all__ = [
    "NAME",
    "FSDP2Backend",
    "FSDP2Config",
    "FSDP2FrozenModel",
    "FSDP2TrainableModel",
    "hf_name",
]


class _Placing(TypedDict):
    device: torch.device
    movable: frozenset[ModelPart]
    host_resident: bool


@attrs.frozen(kw_only=True)
class FSDP2Config:
    """Settings of the ``fsdp2`` backend.

    mixed_precision: compute forward and backward in bf16 and reduce gradients in fp32, keeping
        parameters and optimizer state in fp32. ``None`` turns it on where CUDA is available;
        ``True`` without CUDA is an error (gloo on CPU computes in fp32).
    cpu_offload: keep the sharded parameters, gradients and optimizer state on the host for the
        whole run (FSDP2's ``CPUOffloadPolicy``): each unit is copied to the device for its
        compute and AdamW steps on the host. Nothing is then left for ``offload``/``reload`` to
        move, so the backend declares no offload capability and reports every part on the host.
    reshard_after_forward: free each decoder layer's gathered parameters after its forward in
        training and gather them again for its backward (FSDP2's default). ``False`` keeps them
        from forward to backward: one all-gather per layer and micro-batch instead of two, at the
        cost of holding every layer's gathered compute-dtype parameters (a full copy of the model
        in bf16 on CUDA) until the backward frees them. Frozen models always reshard.
    defer_gradient_sync: honour ``backward(sync_gradients=False)``: the micro-batches before an
        optimizer step's last one accumulate their gradients unsharded and unreduced, and keep
        the gathered parameters for the next forward (one reduce-scatter and one all-gather per
        layer and step instead of one per micro-batch). It holds a full unsharded fp32 copy of
        the gradients and the gathered compute-dtype parameters through the step; on one rank,
        where a shard is the whole tensor, only the latter is extra.
    """

    mixed_precision: bool | None = None
    cpu_offload: bool = False
    reshard_after_forward: bool = True
    defer_gradient_sync: bool = False

    def __attrs_post_init__(self) -> None:
        if self.defer_gradient_sync and self.cpu_offload:
            raise ValueError(
                "FSDP2Config: defer_gradient_sync=True keeps unsharded gradients on the device "
                "between micro-batches, which cpu_offload=True (every part on the host) rules out"
            )


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The outermost modules whose class name is in ``model._no_split_modules`` (transformers'
    layers). One named inside another is left to the outer one's unit: Qwen2-Audio lists both
    its encoder layer and the attention inside it, and sharding a module whose parameters an
    outer unit already sharded fails in ``fully_shard``."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    found: list[tuple[str, torch.nn.Module]] = []
    for path, module in model.named_modules():
        if type(module).__name__ not in names:
            continue
        if any(path.startswith(f"{outer}.") for outer, _ in found):
            continue
        found.append((path, module))
    return [module for _, module in found]


class FSDP2Backend(PlacedBackend[FSDP2Config]):
    """``TrainBackend`` on ``torch.distributed.fsdp.fully_shard``.

    Needs the default process group (``lrft.dist.init_distributed``; a single process uses a
    1-rank group). The device is ``cuda:LOCAL_RANK`` when CUDA is available, else the CPU.
    Wrapping changes the given module in place (FSDP2 swaps its class and shards its
    parameters); the handle's ``module`` is that same object.
    """

    def __init__(self, config: FSDP2Config | None = None) -> None:
        super().__init__(NAME, config if config is not None else FSDP2Config())
        self._mesh: DeviceMesh = init_device_mesh(self._device.type, (dist.get_world_size(),))
        movable = () if self._config.cpu_offload else tuple(ModelPart)
        self._capabilities = TrainCapabilities(
            offload=frozenset(movable),
            mixed_precision=self._mixed,
            # the mesh spans the whole default group: gradients average over every rank
            packed_sequences=True,
            sequence_parallel=True,
        )

    def prepare_trainable(
        self,
        model: torch.nn.Module,
        *,
        optimizer: OptimizerConfig,
        scheduler: SchedulerConfig | None = None,
    ) -> FSDP2TrainableModel:
        """Shard ``model`` and build AdamW and the LR schedule over its trainable parameters.

        The module's train/eval mode is left as it is. Collective over the default group.
        """
        self._shard(
            model,
            reshard_layers_after_forward=self._config.reshard_after_forward,
            reshard_root_after_forward=False,
        )
        adamw, lr_scheduler = adamw_with_schedule(
            model,
            optimizer,
            scheduler,
            # One kernel over all shards on CUDA; the default (foreach) elsewhere. Host-resident
            # shards (cpu_offload) step on the host, where the fused CPU kernel gains little.
            fused=self._device.type == "cuda" and not self._config.cpu_offload,
        )
        return FSDP2TrainableModel(
            model,
            adamw,
            lr_scheduler,
            max_grad_norm=optimizer.max_grad_norm,
            defer_gradient_sync=self._config.defer_gradient_sync,
            **self._placing(),
        )

    def prepare_frozen(self, model: torch.nn.Module) -> FSDP2FrozenModel:
        """Shard ``model`` for inference: no gradients, eval mode, every unit resharded after
        its forward (so no full copy lingers between forwards). Collective."""
        model.requires_grad_(False)
        model.eval()
        self._shard(model, reshard_layers_after_forward=True, reshard_root_after_forward=True)
        return FSDP2FrozenModel(model, **self._placing())

    def _placing(self) -> _Placing:
        return {
            "device": self._device,
            "movable": self._capabilities.offload,
            "host_resident": self._config.cpu_offload,
        }

    def _shard(
        self,
        model: torch.nn.Module,
        *,
        reshard_layers_after_forward: bool,
        reshard_root_after_forward: bool,
    ) -> None:
        layers = decoder_layers(model)
        if not layers:
            warnings.warn(
                f"{type(model).__name__} names no decoder layers in _no_split_modules: the whole "
                "model is one FSDP2 unit (all parameters gathered at once)",
                stacklevel=3,
            )
        mixed = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        mp_policy = mixed if self._mixed else MixedPrecisionPolicy()
        # Pinned host memory needs an accelerator: CPUOffloadPolicy() fails without one.
        offload_policy: OffloadPolicy = (
            CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
            if self._config.cpu_offload
            else OffloadPolicy()
        )
        for layer in layers:
            fully_shard(
                layer,
                mesh=self._mesh,
                mp_policy=mp_policy,
                offload_policy=offload_policy,
                reshard_after_forward=reshard_layers_after_forward,
            )
        fully_shard(
            model,
            mesh=self._mesh,
            mp_policy=mp_policy,
            offload_policy=offload_policy,
            reshard_after_forward=reshard_root_after_forward,
        )
