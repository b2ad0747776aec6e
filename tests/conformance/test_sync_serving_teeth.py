"""The sync suite's checks of what an engine serves after a sync have teeth: a sync that sends a
vision- or audio-language model's language weights only (a name filter written for text
models) is reported fresh and verified, and fails the media-source check; an engine whose
result cache a ``load_weights`` clears but a streamed ``weight_update`` does not fails the check
of outputs after a sync. Both pass the suite's older checks."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
import torch

from lrft.api import (
    RolloutEngine,
    SyncCapabilities,
    SyncReport,
    WeightSource,
    WeightSyncError,
    combine_digests,
)
from lrft.api.digest import tensor_digests
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.backends.sync import DirectSync
from lrft.testing.conformance import sync as sync_checks
from lrft.testing.conformance.sync import SyncMediaModels
from lrft.testing.distributed import DistributedSuite, RankFailure, RankPool
from lrft.testing.models import save_tiny_causal_lm
from lrft.testing.vision_models import save_tiny_vlm
from tests.conformance.test_direct_sync import DirectSyncSuite
from tests.conformance.test_engine_loading_teeth import CachesResults

LANGUAGE_MODEL = ("model.language_model.", "lm_head.")


class SendsTheLanguageModelOnly:
    """A sync as a careless third party writes one for text models: it loads the weights under
    the language model's names, verifies what it sent, and reports the engine fresh and
    verified, while the vision or audio tower and its projector stay as the engine held them."""

    def __init__(self, bucket_bytes: int) -> None:
        self._bucket_bytes = bucket_bytes

    @property
    def capabilities(self) -> SyncCapabilities:
        return SyncCapabilities(verifies_digest=True)

    def sync(self, source: WeightSource, engine: RolloutEngine, *, version: int) -> SyncReport:
        specs = engine.parameter_specs()
        sent: dict[str, torch.Tensor] = {}
        buckets = 0
        with engine.weight_update(version) as load:
            for bucket in source.full_weights(self._bucket_bytes):
                kept = [
                    (name, tensor.to(specs[name].dtype))
                    for name, tensor in bucket
                    if name.startswith(LANGUAGE_MODEL)
                ]
                if kept:
                    load(kept)
                    sent.update((name, tensor.detach().cpu().clone()) for name, tensor in kept)
                    buckets += 1
        digests = tensor_digests(sent)
        held = engine.weights_digest()
        if any(held[name] != digest for name, digest in digests.items()):
            raise WeightSyncError("the engine's digests differ from what was sent")
        return SyncReport(
            version=version,
            tensors=len(sent),
            bytes=sum(t.numel() * t.element_size() for t in sent.values()),
            buckets=buckets,
            seconds=0.0,
            verified=True,
            digest=combine_digests(digests),
        )


class SendsTheLanguageModelOnlySuite(DirectSyncSuite):
    @classmethod
    def make_sync(cls, bucket_bytes: int) -> DirectSync:
        return cast(DirectSync, SendsTheLanguageModelOnly(bucket_bytes))


class CachesResultsSuite(DirectSyncSuite):
    @classmethod
    def make_engine(
        cls, model_dir: Path, dtype: torch.dtype, device: torch.device
    ) -> HFRolloutEngine:
        config = HFEngineConfig(device=device, dtype=dtype)
        return CachesResults.from_pretrained(model_dir, config=config)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_causal_lm(tmp_path_factory.mktemp("serving-teeth-model"), seed=0)


@pytest.fixture(scope="module")
def vlm_only(tmp_path_factory: pytest.TempPathFactory) -> SyncMediaModels:
    """The tiny Qwen2-VL, and for audio a folder no engine serves (the check then runs the
    vision-language source alone)."""
    root = tmp_path_factory.mktemp("serving-teeth-media")
    return SyncMediaModels(vlm_dir=save_tiny_vlm(root / "vlm", seed=0), audio_dir=root / "none")


class TestSyncServingTeethWorld1(DistributedSuite):
    world_size = 1

    def test_a_sync_that_skips_the_vision_tower_fails(
        self, pool: RankPool, vlm_only: SyncMediaModels
    ) -> None:
        with pytest.raises(
            RankFailure,
            match=r"after sync 1 of a vision-language source: weights_digest\(\) shows the "
            r"engine's vision tower and its projector are not the trainer's: \d+ of their \d+ tensors "
            r"differ, e\.g\. \['model\.visual\.",
        ):
            pool.run(
                sync_checks.check_media_towers_follow_each_sync,
                SendsTheLanguageModelOnlySuite,
                vlm_only,
            )

    def test_an_engine_cache_a_stream_does_not_clear_fails(
        self, pool: RankPool, model_dir: Path
    ) -> None:
        suite = CachesResultsSuite()
        suite.run_check(pool, sync_checks.check_sync_after_training, model_dir)  # passes
        with pytest.raises(
            RankFailure,
            match=r"after a sync into an engine that had generated before it, the engine's greedy "
            r"tokens .* differ from those of a plain model holding the trainer's weights, .*; "
            r"they are what it gave before the sync: results or a cache of the old weights "
            r"outlived it",
        ):
            suite.run_check(pool, sync_checks.check_outputs_follow_a_streamed_sync, model_dir)
