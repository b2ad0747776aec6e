"""Every GPU test must leave this process's CUDA allocator able to return memory: a test that
breaks it (a CUDA-graph capture left open keeps ``empty_cache`` from releasing anything) fails
itself, instead of a later test that measures memory."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

_PROBE_BYTES = 64 * 2**20


@pytest.fixture(autouse=True)
def _allocator_still_releases() -> Iterator[None]:
    yield
    # unannotated in torch
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return
    device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved(device)
    probe = torch.empty(_PROBE_BYTES, dtype=torch.uint8, device=device)
    del probe
    torch.cuda.empty_cache()
    kept = torch.cuda.memory_reserved(device) - before
    assert kept <= 0, (
        f"after this test, torch.cuda.empty_cache() no longer returns free memory: a freed "
        f"{_PROBE_BYTES / 2**20:.0f} MiB tensor left {kept / 2**20:.1f} MiB reserved"
    )
