"""The conformance suites on NCCL/CUDA at world 2 (the hf engine and the direct sync at world 1
too): the same tests as tests/conformance, on GPUs; and the sync suite's cross_device test on a
sync that stages each bucket onto the engine's GPU.

Skipped with a reason where too few CUDA devices are visible (CI has none).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import torch

from lrft.api import RolloutEngine, SyncCapabilities, SyncReport, WeightSource
from lrft.backends.rollout.hf import HFRolloutEngine
from lrft.backends.sync import DirectSync
from tests.conformance.test_direct_sync import DirectSyncSuite
from tests.conformance.test_fsdp2 import FSDP2Suite
from tests.conformance.test_hf_engine import HFEngineSuite
from tests.conformance.test_layout_hf import HFLayoutSuite


class TestFSDP2CudaWorld2(FSDP2Suite):
    world_size = 2
    device_type = "cuda"


class TestHFEngineCudaWorld1(HFEngineSuite):
    """The default CUDA path (static cache, CUDA graphs) on one GPU."""

    world_size = 1
    device_type = "cuda"


class TestHFEngineCudaWorld2(HFEngineSuite):
    world_size = 2
    device_type = "cuda"


class TestDirectSyncCudaWorld1(DirectSyncSuite):
    """One rank: the sync writes each bucket straight into the engine's storage through the
    fused cast-and-fingerprint kernel."""

    world_size = 1
    device_type = "cuda"


class TestDirectSyncCudaWorld2(DirectSyncSuite):
    world_size = 2
    device_type = "cuda"


class TestLayoutCudaWorld2Tp2(HFLayoutSuite):
    world_size = 2
    device_type = "cuda"
    tp_size = 2


class _OnDevice:
    """A weight source whose buckets are copied to ``device`` as they come."""

    def __init__(self, source: WeightSource, device: torch.device) -> None:
        self._source, self._device = source, device

    def full_weights(
        self, bucket_bytes: int, *, gather_dtype: torch.dtype | None = None
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        for bucket in self._source.full_weights(bucket_bytes, gather_dtype=gather_dtype):
            yield [(name, tensor.to(self._device)) for name, tensor in bucket]


class StagingSync:
    """A cross-device sync in the shape of one: each bucket is copied to the engine's device,
    then ``DirectSync`` loads and verifies it there."""

    def __init__(self, bucket_bytes: int) -> None:
        self._inner = DirectSync(bucket_bytes=bucket_bytes)

    @property
    def capabilities(self) -> SyncCapabilities:
        return SyncCapabilities(verifies_digest=True, cross_device=True)

    def sync(self, source: WeightSource, engine: RolloutEngine, *, version: int) -> SyncReport:
        assert isinstance(engine, HFRolloutEngine), f"an hf engine is expected: {engine!r}"
        return self._inner.sync(_OnDevice(source, engine.device), engine, version=version)


class TestStagingSyncCudaWorld2(DirectSyncSuite):
    """The suite's cross_device test (an engine on the next rank's GPU) on a sync that
    declares it."""

    world_size = 2
    device_type = "cuda"

    @classmethod
    def make_sync(cls, bucket_bytes: int) -> DirectSync:
        return cast(DirectSync, StagingSync(bucket_bytes))
