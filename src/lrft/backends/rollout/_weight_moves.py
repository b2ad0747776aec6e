"""Where an in-process engine's weights live while it sleeps: each move replaces the
parameters' data, keeping the Parameter objects (and so the model's references to them).

Moving the weights changes their addresses (a CUDA-graph decode loop notices and captures again)
but not their shapes, dtypes or devices once awake, which is all a compiled decode step guards
on: it is not recompiled.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from lrft.api.types import TensorSpec


def park(params: Mapping[str, torch.nn.Parameter], device: torch.device) -> None:
    """Level 1: copy the weights to host memory (pinned, where CUDA can use it) and let the
    device copies go."""
    if device.type == "cpu":
        return  # already in host memory
    pin = device.type == "cuda"
    for parameter in params.values():
        host = torch.empty(parameter.shape, dtype=parameter.dtype, pin_memory=pin)
        host.copy_(parameter.data)
        parameter.data = host


def restore(params: Mapping[str, torch.nn.Parameter], device: torch.device) -> None:
    """Back from :func:`park`: the parked weights onto ``device``."""
    for parameter in params.values():
        parameter.data = parameter.data.to(device, non_blocking=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release(params: Mapping[str, torch.nn.Parameter], device: torch.device) -> None:
    """Level 2: drop the weights (their contents are gone; the shapes stay in the specs)."""
    for parameter in params.values():
        # Replacing the data drops the only reference to the old storage, which frees it.
        parameter.data = torch.empty(0, dtype=parameter.dtype, device=device)


def allocate(
    params: Mapping[str, torch.nn.Parameter],
    specs: Mapping[str, TensorSpec],
    device: torch.device,
) -> None:
    """Back from :func:`release`: uninitialised storage of each weight's shape and dtype."""
    for name, parameter in params.items():
        spec = specs[name]
        parameter.data = torch.empty(spec.shape, dtype=spec.dtype, device=device)
