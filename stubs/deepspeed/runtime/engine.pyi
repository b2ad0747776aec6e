import os
from collections.abc import Container, Mapping
from typing import Any

import torch
from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum, OffloadStateTypeEnum

class DeepSpeedEngine(torch.nn.Module):
    module: torch.nn.Module
    # A ZeRO optimizer (stage_1_and_2.DeepSpeedZeroOptimizer, stage3.DeepSpeedZeroOptimizer_Stage3)
    # for a trainable model, parameter_offload.DeepSpeedZeRoOffload for a ZeRO-3 inference one.
    optimizer: object
    device: torch.device
    global_steps: int
    def backward(
        self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True
    ) -> torch.Tensor: ...
    def step(self, lr_kwargs: Mapping[str, Any] | None = None) -> None: ...
    def was_step_applied(self) -> bool: ...
    def get_global_grad_norm(self) -> float | torch.Tensor | None: ...
    def get_lr(self) -> list[float]: ...
    def zero_optimization_stage(self) -> int: ...
    def empty_partition_cache(self) -> None: ...
    def offload_states(
        self,
        include: Container[OffloadStateTypeEnum] | None = None,
        device: OffloadDeviceEnum = ...,
        pin_memory: bool = True,
        non_blocking: bool = False,
    ) -> None: ...
    def reload_states(self, non_blocking: bool = False) -> None: ...
    def save_checkpoint(
        self,
        save_dir: str | os.PathLike[str],
        tag: str | None = None,
        client_state: Mapping[str, Any] = ...,
        save_latest: bool = True,
        exclude_frozen_parameters: bool = False,
    ) -> bool: ...
    def load_checkpoint(
        self,
        load_dir: str | os.PathLike[str],
        tag: str | None = None,
        load_module_strict: bool = True,
        load_optimizer_states: bool = True,
        load_lr_scheduler_states: bool = True,
        load_module_only: bool = False,
    ) -> tuple[str | None, dict[str, Any] | None]: ...
