"""The ``deepspeed`` TrainBackend: DeepSpeed ZeRO stages 1, 2 and 3.

Trainable models are wrapped by ``deepspeed.initialize`` with a torch AdamW (decoupled weight
decay, built from ``OptimizerConfig``) and a ``LambdaLR`` over ``SchedulerConfig.multiplier``:
DeepSpeed's own fused or CPU Adam would JIT-compile on first use, and a torch optimizer steps the
same way on every device. The DeepSpeed config is generated from :class:`DeepSpeedConfig`. On
CUDA the parameters are bf16 with fp32 master weights and AdamW state; on CPU all is fp32.

Frozen models (reference, reward) are partitioned by a ZeRO-3 inference engine when
``DeepSpeedConfig.partitions_frozen``, else each rank holds a plain replica on its device.

DeepSpeed is imported when a backend is built, never by importing this module or ``lrft``.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from lrft.api.capabilities import TrainCapabilities
from lrft.api.optim import OptimizerConfig, SchedulerConfig
from lrft.backends.train._deepspeed_config import (
    DeepSpeedConfig,
    ZeroStage,
    merge_override,
    read_override,
)
from lrft.backends.train._deepspeed_memory import movable_parts
from lrft.backends.train._deepspeed_models import (
    NAME,
    DeepSpeedFrozenModel,
    DeepSpeedTrainableModel,
    hf_named_parameters,
)
from lrft.backends.train._placement import PlacedBackend
from lrft.backends.train._training import adamw_with_schedule

__all__ = [
    "NAME",
    "DeepSpeedBackend",
    "DeepSpeedConfig",
    "DeepSpeedFrozenModel",
    "DeepSpeedTrainableModel",
    "ZeroStage",
    "hf_named_parameters",
    "merge_override",
    "movable_parts",
    "read_override",
    "require_deepspeed",
]

INSTALL_HINT = "pip install 'lrft[deepspeed]'"


def require_deepspeed() -> None:
    """Import deepspeed, or raise ``ImportError`` naming the extra that installs it."""
    try:
        import deepspeed  # noqa: F401
    except ImportError as error:
        raise ImportError(f"the deepspeed train backend needs DeepSpeed: {INSTALL_HINT}") from error


def _init_deepspeed_comm(device: torch.device) -> None:
    import deepspeed
    import deepspeed.ops

    if "LOCAL_RANK" not in os.environ:
        # DeepSpeed 0.19.8 asserts that its launcher or torchrun set LOCAL_RANK. A rank started
        # some other way (spawned test ranks) gets its device index, or its rank on the CPU.
        local = device.index if device.type == "cuda" else dist.get_rank()
        os.environ["LOCAL_RANK"] = str(local)
    if device.type == "cpu":
        # DeepSpeed 0.19.8 JIT-compiles its shared-memory CPU collectives (45-90 s, needs a
        # compiler) the first time its communication starts, unless the op is marked
        # incompatible; gloo then does the same work.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    # Adopts the default process group lrft already initialised.
    deepspeed.init_distributed(
        dist_backend=dist.get_backend(), dist_init_required=False, verbose=False
    )


class DeepSpeedBackend(PlacedBackend[DeepSpeedConfig]):
    """``TrainBackend`` on DeepSpeed ZeRO.

    Needs the default process group (``lrft.dist.init_distributed``; a single process uses a
    1-rank group) and deepspeed (``pip install 'lrft[deepspeed]'``). The device is
    ``cuda:LOCAL_RANK`` when CUDA is available, else the CPU. Each ``prepare_*`` call builds one
    DeepSpeed engine around the given module (ZeRO-3 partitions its parameters in place).
    """

    def __init__(self, config: DeepSpeedConfig | None = None) -> None:
        require_deepspeed()
        super().__init__(NAME, config if config is not None else DeepSpeedConfig())
        # The override is checked against this world and precision now, not at the first wrap.
        self._config.deepspeed_config(
            world_size=dist.get_world_size(), mixed_precision=self._mixed, max_grad_norm=None
        )
        _init_deepspeed_comm(self._device)
        self._capabilities = TrainCapabilities(
            offload=movable_parts(self._config.zero_stage),
            mixed_precision=self._mixed,
            # gradients are averaged over the whole default group (DeepSpeed's data-parallel
            # group without a model-parallel unit), so sequence-parallel shards add up
            packed_sequences=True,
            sequence_parallel=True,
        )

    def deepspeed_config(
        self, *, max_grad_norm: float | None, zero_stage: int | None = None
    ) -> dict[str, object]:
        """The DeepSpeed config this backend hands to ``deepspeed.initialize``."""
        return self._config.deepspeed_config(
            world_size=dist.get_world_size(),
            mixed_precision=self._mixed,
            max_grad_norm=max_grad_norm,
            zero_stage=zero_stage,
        )

    def prepare_trainable(
        self,
        model: torch.nn.Module,
        *,
        optimizer: OptimizerConfig,
        scheduler: SchedulerConfig | None = None,
    ) -> DeepSpeedTrainableModel:
        """Wrap ``model`` in a ZeRO engine with AdamW and the LR schedule over its trainable
        parameters. The module's train/eval mode is left as it is. Collective."""
        import deepspeed

        adamw, lr_scheduler = adamw_with_schedule(model, optimizer, scheduler)
        training = model.training
        engine, *_ = deepspeed.initialize(
            model=model,
            optimizer=adamw,
            lr_scheduler=lr_scheduler,
            config=self.deepspeed_config(max_grad_norm=optimizer.max_grad_norm),
            dist_init_required=False,
        )
        engine.train(training)
        return DeepSpeedTrainableModel(
            model, engine, lr_scheduler, device=self._device, movable=self._capabilities.offload
        )

    def prepare_frozen(self, model: torch.nn.Module) -> DeepSpeedFrozenModel:
        """Wrap ``model`` for inference: no gradients, eval mode; partitioned by a ZeRO-3
        inference engine or a plain replica on the device. Collective."""
        model.requires_grad_(False)
        model.eval()
        if not self._config.partitions_frozen:
            model.to(self._device)
            if self._mixed:
                model.to(torch.bfloat16)
            return DeepSpeedFrozenModel(
                model, engine=None, device=self._device, movable=self._capabilities.offload
            )
        import deepspeed

        engine, *_ = deepspeed.initialize(
            model=model,
            config=self.deepspeed_config(max_grad_norm=None, zero_stage=3),
            dist_init_required=False,
        )
        engine.eval()
        return DeepSpeedFrozenModel(
            model, engine=engine, device=self._device, movable=self._capabilities.offload
        )
