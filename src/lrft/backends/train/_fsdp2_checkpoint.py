"""Sharded checkpoints of an FSDP2 model with torch.distributed.checkpoint (DCP).

Every rank writes its own shards of the model's trainable parameters and of the AdamW state;
rank 0 writes the small remainder (scheduler state and the optimizer-step count) as JSON, whose
float repr round-trips exactly, so a resumed run is bit-exactly the uninterrupted one. Frozen
parameters (a LoRA model's base) are not written: they come from the pretrained weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.optim.lr_scheduler import LambdaLR

from lrft.api.errors import LrftError
from lrft.backends.train._training import barrier

TRAIN_STATE_FILE = "lrft_train_state.json"
_TRAINABLE = StateDictOptions(ignore_frozen_params=True)
# Loading a state dict without the frozen parameters: DCP has already checked that every
# trainable parameter was in the checkpoint.
_INTO_TRAINABLE = StateDictOptions(ignore_frozen_params=True, strict=False)


def save(
    directory: Path,
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LambdaLR,
    *,
    optimizer_steps: int,
) -> None:
    """Write ``module``, ``optimizer`` and ``scheduler`` into ``directory``. Collective."""
    directory.mkdir(parents=True, exist_ok=True)
    state: dict[str, Any] = {"model": get_model_state_dict(module, options=_TRAINABLE)}
    # Before the first step AdamW has no state. Asking DCP for it would run a zero-lr "init"
    # step that creates state with step=1, changing the bias correction of the next real step.
    if optimizer_steps > 0:
        state["optimizer"] = get_optimizer_state_dict(module, optimizer, options=_TRAINABLE)
    dcp_save(state, checkpoint_id=directory)
    if dist.get_rank() == 0:
        remainder = {"optimizer_steps": optimizer_steps, "scheduler": scheduler.state_dict()}
        (directory / TRAIN_STATE_FILE).write_text(json.dumps(remainder, indent=1))
    barrier()  # nobody reads the checkpoint before rank 0 has written its part


def load(
    directory: Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: LambdaLR
) -> int:
    """Restore what ``save`` wrote into a freshly wrapped model; returns the optimizer steps."""
    state_file = directory / TRAIN_STATE_FILE
    if not state_file.is_file():
        raise LrftError(f"{directory} is not an fsdp2 checkpoint: {TRAIN_STATE_FILE} is missing")
    remainder = json.loads(state_file.read_text())
    optimizer_steps = int(remainder["optimizer_steps"])
    state: dict[str, Any] = {"model": get_model_state_dict(module, options=_TRAINABLE)}
    if optimizer_steps > 0:
        state["optimizer"] = get_optimizer_state_dict(module, optimizer, options=_TRAINABLE)
    dcp_load(state, checkpoint_id=directory)
    set_model_state_dict(module, state["model"], options=_INTO_TRAINABLE)
    if optimizer_steps > 0:
        set_optimizer_state_dict(module, optimizer, state["optimizer"], options=_TRAINABLE)
    scheduler.load_state_dict(remainder["scheduler"])
    return optimizer_steps
