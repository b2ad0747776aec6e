"""``direct`` weight sync from the fsdp2 backend into the hf engine, at world sizes 1, 2 and 4,
and unverified (``verify=False``, which declares no ``verifies_digest``) at world 1."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from lrft.api import RolloutEngine
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.backends.sync import DirectSync
from lrft.backends.train.fsdp2 import FSDP2Backend, FSDP2Config
from lrft.testing.conformance.sync import WeightSyncSuite


class DirectSyncSuite(WeightSyncSuite[DirectSync]):
    @classmethod
    def make_sync(cls, bucket_bytes: int) -> DirectSync:
        return DirectSync(bucket_bytes=bucket_bytes)

    @classmethod
    def make_train_backend(cls) -> FSDP2Backend:
        return FSDP2Backend(FSDP2Config(mixed_precision=False))

    @classmethod
    def make_engine(
        cls, model_dir: Path, dtype: torch.dtype, device: torch.device
    ) -> HFRolloutEngine:
        config = HFEngineConfig(device=device, dtype=dtype)
        return HFRolloutEngine.from_pretrained(model_dir, config=config)

    @classmethod
    def read_engine_weights(cls, engine: RolloutEngine) -> Mapping[str, torch.Tensor]:
        assert isinstance(engine, HFRolloutEngine)
        return dict(engine.model.named_parameters())


class TestDirectSyncWorld1(DirectSyncSuite):
    world_size = 1


class TestDirectSyncWorld2(DirectSyncSuite):
    world_size = 2


class TestDirectSyncWorld4(DirectSyncSuite):
    world_size = 4


class TestDirectSyncUnverifiedWorld1(DirectSyncSuite):
    """Without verification: each bucket goes to the engine as gathered and the report says
    ``verified=False`` (the corruption tests skip: the sync declares no verifies_digest)."""

    world_size = 1

    @classmethod
    def make_sync(cls, bucket_bytes: int) -> DirectSync:
        return DirectSync(bucket_bytes=bucket_bytes, verify=False)
