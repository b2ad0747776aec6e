"""Start-up shared by the train backends: the process group they need, the device they compute
on, and whether they compute in bf16."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from lrft.api.errors import ConfigError


def require_process_group(backend: str) -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            f"the {backend} backend needs torch.distributed to be initialised: call "
            "lrft.dist.init_distributed() first (a single process uses a 1-rank group)"
        )


def current_device() -> torch.device:
    """``cuda:LOCAL_RANK`` (or the current CUDA device) where CUDA exists, else the CPU; the
    CUDA device is made current."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    local_rank = os.environ.get("LOCAL_RANK")
    index = int(local_rank) if local_rank is not None else torch.cuda.current_device()
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    return device


def resolve_mixed_precision(requested: bool | None, device: torch.device, setting: str) -> bool:
    """``None`` means bf16 where CUDA is available; ``True`` without CUDA is a ConfigError naming
    ``setting`` (gloo on CPU computes in fp32)."""
    on_cuda = device.type == "cuda"
    if requested and not on_cuda:
        raise ConfigError(
            f"{setting}=True needs CUDA (bf16 compute); use None to enable it only where CUDA "
            "is available"
        )
    return on_cuda if requested is None else requested
