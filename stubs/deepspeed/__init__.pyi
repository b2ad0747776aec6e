# Typed stubs for the parts of DeepSpeed (0.19.x) that lrft touches; nothing more.
from collections.abc import Mapping
from typing import Any

import torch
from deepspeed import ops as ops
from deepspeed.runtime import zero as zero
from deepspeed.runtime.engine import DeepSpeedEngine
from torch.optim.lr_scheduler import LRScheduler

__version__: str

def init_distributed(
    dist_backend: str | None = None,
    *,
    dist_init_required: bool | None = None,
    verbose: bool = True,
) -> None: ...
def initialize(
    *,
    model: torch.nn.Module,
    config: Mapping[str, Any],
    optimizer: torch.optim.Optimizer | None = None,
    lr_scheduler: LRScheduler | None = None,
    dist_init_required: bool | None = None,
) -> tuple[DeepSpeedEngine, object, object, object]: ...
