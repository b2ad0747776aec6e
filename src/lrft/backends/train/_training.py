"""What the train backends build the same way for a trainable model: a torch AdamW and a LambdaLR
over ``lrft.api.optim``'s configs, and the barrier that ends a checkpoint write."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.optim.lr_scheduler import LambdaLR

from lrft.api.optim import OptimizerConfig, SchedulerConfig


def adamw_with_schedule(
    model: torch.nn.Module,
    optimizer: OptimizerConfig,
    scheduler: SchedulerConfig | None,
    *,
    fused: bool | None = None,
) -> tuple[torch.optim.AdamW, LambdaLR]:
    """AdamW (decoupled weight decay) over ``model``'s trainable parameters and the LR schedule
    ``scheduler`` gives it (constant when ``None``). ``fused``: torch's choice of AdamW kernel
    (``None``: its default, foreach)."""
    params = [p for p in model.parameters() if p.requires_grad]
    adamw = torch.optim.AdamW(
        params,
        lr=optimizer.lr,
        betas=optimizer.betas,
        eps=optimizer.eps,
        weight_decay=optimizer.weight_decay,
        fused=fused,
    )
    schedule = scheduler if scheduler is not None else SchedulerConfig()
    return adamw, LambdaLR(adamw, _multiplier(schedule))


def _multiplier(schedule: SchedulerConfig) -> Callable[[int], float]:
    # A plain function: LambdaLR.state_dict stores None for it (it copies the __dict__ of any
    # other callable), so the checkpoint holds no callable state.
    def multiplier(step: int) -> float:
        return schedule.multiplier(step)

    return multiplier


def barrier() -> None:
    """Every rank waits here: nobody reads a checkpoint before every rank has written its part."""
    if dist.get_backend() == "nccl":
        dist.barrier(device_ids=[torch.cuda.current_device()])  # names the device: no warning
    else:
        dist.barrier()
