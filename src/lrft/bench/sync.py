"""The weight-sync and engine-memory parts: ``direct`` sync from an ``fsdp2`` actor into the
``hf`` engine, and the engine's sleep levels, against this run's copy ceilings.

Sync bandwidth counts the bytes the engine ends up holding (its dtype), once: the ceiling it is
compared with is one device-to-device copy of as many bytes, the least any sync must do; with
several ranks, also an all-gather of that many bytes (what gathering full weights from shards
needs). Waking from level 1 moves the parked weights back from pinned host memory, so it is
compared with a pinned host-to-device copy of the engine's bytes.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from lrft.api.optim import OptimizerConfig
from lrft.api.protocols import RolloutEngine
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.backends.sync.direct import DirectSync
from lrft.backends.train.fsdp2 import FSDP2Backend, FSDP2Config
from lrft.bench.assets import random_model
from lrft.bench.ceilings import (
    all_gather_bus_gbps,
    cast_copy_seconds,
    compute_dtype,
    device_copy_gbps,
    host_to_device_gbps,
    synchronize,
)
from lrft.bench.workloads import Workload
from lrft.dist import RankInfo, init_distributed


def _engine(workload: Workload, device: torch.device) -> HFRolloutEngine:
    model = random_model(workload.model, device)
    config = HFEngineConfig(dtype=compute_dtype(device), device=device)
    return HFRolloutEngine(model, config=config)


def engine_bytes(engine: RolloutEngine) -> int:
    return sum(
        int(torch.Size(spec.shape).numel()) * torch.empty((), dtype=spec.dtype).element_size()
        for spec in engine.parameter_specs().values()
    )


def _timed(fn: Any, device: torch.device) -> float:
    synchronize(device)
    began = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - began


def run_sync(workload: Workload) -> dict[str, Any]:
    """Two warm-up syncs of each kind, then ``repeats`` rounds of a verified sync, an
    unverified one and the gather alone. Collective."""
    spec = workload.sync
    assert spec is not None
    info = init_distributed(RankInfo.from_env())
    backend = FSDP2Backend(FSDP2Config())
    device = backend.device
    actor = backend.prepare_trainable(
        random_model(workload.model, device), optimizer=OptimizerConfig(lr=1e-6)
    )
    engine = _engine(workload, device)
    verified = DirectSync()
    unverified = DirectSync(verify=False)
    version = 0
    # Warm-up: the first syncs check and plan every bucket, the second ones capture the CUDA
    # graphs the timed ones replay.
    for _ in range(2):
        version += 1
        report = verified.sync(actor, engine, version=version)
        version += 1
        unverified.sync(actor, engine, version=version)
    seconds: dict[str, list[float]] = {"verified": [], "unverified": [], "gather_only": []}
    for _ in range(spec.repeats):
        version += 1
        seconds["verified"].append(
            _timed(lambda v=version: verified.sync(actor, engine, version=v), device)
        )
        version += 1
        seconds["unverified"].append(
            _timed(lambda v=version: unverified.sync(actor, engine, version=v), device)
        )
        # the gather the syncs ask for: in the engine's dtype, cast before any collective
        seconds["gather_only"].append(
            _timed(
                lambda: _drain(
                    actor.full_weights(verified.bucket_bytes, gather_dtype=compute_dtype(device))
                ),
                device,
            )
        )
    nbytes = engine_bytes(engine)
    copy = device_copy_gbps(device, nbytes)
    trainer_dtype = _trainer_dtype(actor.module)
    engine_dtype = compute_dtype(device)
    cast = cast_copy_seconds(device, nbytes // engine_dtype.itemsize, trainer_dtype, engine_dtype)
    gather = all_gather_bus_gbps(device, nbytes)
    median = {name: statistics.median(values) for name, values in seconds.items()}
    gbps = {name: nbytes / value / 1e9 for name, value in median.items()}
    engine.shutdown()
    return {
        "engine_dtype": str(engine_dtype).removeprefix("torch."),
        "tensors": report.tensors,
        "bytes": nbytes,
        "buckets": report.buckets,
        "bucket_bytes": verified.bucket_bytes,
        "seconds_median": median,
        "seconds": seconds,
        "GBps": gbps,
        "device_copy_GBps": copy,
        "fraction_of_device_copy": {name: value / copy for name, value in gbps.items()},
        "trainer_dtype": str(trainer_dtype).removeprefix("torch."),
        "cast_copy_seconds": cast,
        "fraction_of_cast_copy": {name: cast / value for name, value in median.items()},
        "all_gather_bus_GBps": gather,
        "fraction_of_all_gather": (
            None
            if gather is None
            else {
                name: all_gather_seconds(nbytes, info.world_size, gather) / value
                for name, value in median.items()
            }
        ),
        "world_size": info.world_size,
    }


def _trainer_dtype(module: torch.nn.Module) -> torch.dtype:
    """The dtype the trainer keeps its weights in (what a sync reads)."""
    dtypes = {p.dtype for p in module.parameters()}
    if len(dtypes) != 1:
        raise ValueError(f"the benchmark model holds parameters of several dtypes: {dtypes}")
    return dtypes.pop()


def all_gather_seconds(nbytes: int, world_size: int, bus_gbps: float) -> float:
    """Seconds an all-gather of ``nbytes`` in all takes at ``bus_gbps`` of bus bandwidth (each
    rank receives the ``(world - 1) / world`` of the bytes it does not hold)."""
    return nbytes * (world_size - 1) / world_size / (bus_gbps * 1e9)


def _drain(buckets: Any) -> None:
    for _ in buckets:
        pass


def run_sleep(workload: Workload) -> dict[str, Any]:
    """Sleep/wake cycles at levels 1 and 2, with the device memory each frees. Needs no group."""
    spec = workload.sleep
    assert spec is not None
    info = RankInfo.from_env()
    device = info.device
    engine = _engine(workload, device)
    nbytes = engine_bytes(engine)
    results: dict[str, Any] = {
        "bytes": nbytes,
        "frees_memory": engine.capabilities.sleep_frees_memory,
    }
    for level in (1, 2):
        cycle(engine, level, device)  # warm-up (pinned buffers, allocator)
        runs = [cycle(engine, level, device) for _ in range(spec.repeats)]
        results[f"level{level}"] = {
            "sleep_seconds_median": statistics.median(r["sleep_seconds"] for r in runs),
            "wake_seconds_median": statistics.median(r["wake_seconds"] for r in runs),
            "freed_bytes": min(r["freed_bytes"] for r in runs),
            "runs": runs,
        }
    wake1 = results["level1"]["wake_seconds_median"]
    h2d = host_to_device_gbps(device, nbytes)
    results["level1"]["wake_GBps"] = nbytes / wake1 / 1e9 if wake1 > 0 else None
    results["host_to_device_pinned_GBps"] = h2d
    results["level1"]["fraction_of_host_to_device"] = (
        None if h2d is None or wake1 <= 0 else nbytes / wake1 / 1e9 / h2d
    )
    engine.shutdown()
    return results


def _allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def cycle(engine: HFRolloutEngine, level: int, device: torch.device) -> dict[str, float]:
    """One sleep at ``level`` and the wake after it; at level 2 the engine is stale afterwards
    (weights allocated, contents undefined) until a sync, which the sync part measures."""
    before = _allocated(device)
    sleep = _timed(lambda: engine.sleep(level), device)
    asleep = _allocated(device)
    wake = _timed(engine.wake, device)
    return {
        "sleep_seconds": sleep,
        "wake_seconds": wake,
        "freed_bytes": float(before - asleep),
    }
