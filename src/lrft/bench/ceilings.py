"""Timing and the device's ceilings, measured in the same run as the figures they bound.

A figure is only meaningful next to what the hardware can do in that run (clocks, other
tenants, driver): every benchmark part measures its own ceiling right before it reports. On CUDA
times come from device events after warm-up; on the CPU from the host clock.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from lrft.dist.collectives import all_gather_into


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(
    fn: Callable[[], object], device: torch.device, *, repeats: int, warmup: int = 1
) -> float:
    """The median of ``repeats`` timed calls of ``fn`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    for _ in range(repeats):
        if device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # unannotated in torch
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # unannotated in torch
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(float(start.elapsed_time(end)) / 1000.0)
        else:
            began = time.perf_counter()
            fn()
            times.append(time.perf_counter() - began)
    return statistics.median(times)


def compute_dtype(device: torch.device) -> torch.dtype:
    """The dtype lrft trains and rolls out in on ``device``: bf16 on CUDA, fp32 on the CPU."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def matmul_tflops(device: torch.device, *, size: int, repeats: int) -> float:
    """TFLOP/s of a ``size``^3 matmul in :func:`compute_dtype` on random data (``2 size^3`` FLOP)."""
    dtype = compute_dtype(device)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    out = torch.empty(size, size, device=device, dtype=dtype)
    seconds = median_seconds(lambda: torch.matmul(a, b, out=out), device, repeats=repeats)
    return 2 * size**3 / seconds / 1e12


def device_copy_gbps(device: torch.device, nbytes: int, *, repeats: int = 5) -> float:
    """GB/s of one ``nbytes`` device-to-device copy, counting the bytes copied once (the
    convention of the sync figures it bounds; read + write traffic is twice this)."""
    source = torch.randint(0, 255, (max(nbytes, 1),), dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    seconds = median_seconds(lambda: target.copy_(source), device, repeats=repeats)
    return source.numel() / seconds / 1e9


def cast_copy_seconds(
    device: torch.device,
    numel: int,
    source: torch.dtype,
    target: torch.dtype,
    *,
    repeats: int = 5,
) -> float:
    """Seconds of one copy of ``numel`` elements from ``source`` into ``target`` dtype on
    ``device``: every byte of the one read and every byte of the other written, once."""
    values = torch.randn(max(numel, 1), device=device).to(source)
    out = torch.empty(values.shape, dtype=target, device=device)
    return median_seconds(lambda: out.copy_(values), device, repeats=repeats)


def host_to_device_gbps(device: torch.device, nbytes: int, *, repeats: int = 5) -> float | None:
    """GB/s of an ``nbytes`` copy from pinned host memory to the device; ``None`` off CUDA."""
    if device.type != "cuda":
        return None
    host = torch.randint(0, 255, (max(nbytes, 1),), dtype=torch.uint8).pin_memory()
    target = torch.empty(host.shape, dtype=host.dtype, device=device)
    seconds = median_seconds(lambda: target.copy_(host, non_blocking=True), device, repeats=repeats)
    return host.numel() / seconds / 1e9


def all_gather_bus_gbps(
    device: torch.device, total_bytes: int, *, repeats: int = 5
) -> float | None:
    """Bus bandwidth (GB/s) of an all-gather of ``total_bytes`` over the default group, each rank
    contributing an equal shard: ``(world - 1) / world * total_bytes / seconds``, the NCCL tests'
    convention. ``None`` with one rank. Collective."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    world = dist.get_world_size()
    shard = max(total_bytes // world, 1)
    local = torch.randint(0, 255, (shard,), dtype=torch.uint8, device=device)
    gathered = torch.empty(shard * world, dtype=torch.uint8, device=device)
    seconds = median_seconds(lambda: all_gather_into(gathered, local), device, repeats=repeats)
    return (world - 1) / world * gathered.numel() / seconds / 1e9


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return platform.processor() or platform.machine() or "cpu"
