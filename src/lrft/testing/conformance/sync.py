"""``WeightSyncSuite[S]``: the shared conformance tests of a ``WeightSync``.

A subclass says how to build the sync under test, the train backend that feeds it, the engine it
fills, and a backdoor that reads the engine's weights without the API under test::

    class TestDirectSync(WeightSyncSuite[DirectSync]):
        world_size = 2

        @classmethod
        def make_sync(cls, bucket_bytes: int) -> DirectSync:
            return DirectSync(bucket_bytes=bucket_bytes)

        @classmethod
        def make_engine(
            cls, model_dir: Path, dtype: torch.dtype, device: torch.device
        ) -> HFRolloutEngine:
            return HFRolloutEngine.from_pretrained(
                model_dir, config=HFEngineConfig(device=device, dtype=dtype)
            )
        ...

The reference is plain: the trained weights gathered through ``full_weights`` are loaded into a
plain transformers model whose greedy tokens (a full forward per token) the engine must reproduce.
Verification is what the sync declares: one that declares ``verifies_digest`` must report
``verified=True`` and catch corruption; one that does not must report ``verified=False``. The
suite puts proxies between the sync and the real engine (they forward every attribute): a sync
must reach the engine through its ``RolloutEngine`` API.

The checks are module-level functions taking the suite class, exported here with the proxies,
so they can also run on a harness of your own (inside ranks of an initialised process group).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lrft.testing.conformance._sync_changes_checks import check_merged_sync_and_changes_only
from lrft.testing.conformance._sync_checks import (
    check_corruption_detected,
    check_failing_source_drains,
    check_misdirected_writes_detected,
    check_sync_after_training,
    check_sync_casts,
    check_sync_into_deep_sleep,
    check_sync_to_another_device,
    check_tied_embeddings,
    trained_source,
)
from lrft.testing.conformance._sync_hooks import S, WeightSyncHooks
from lrft.testing.conformance._sync_proxies import (
    CorruptInTransit,
    CountsEngineCalls,
    LoaderProxy,
    MisdirectInPlace,
    StreamProbe,
)
from lrft.testing.distributed import RankPool
from lrft.testing.models import save_tiny_causal_lm

__all__ = [
    "CorruptInTransit",
    "CountsEngineCalls",
    "LoaderProxy",
    "MisdirectInPlace",
    "StreamProbe",
    "WeightSyncSuite",
    "check_corruption_detected",
    "check_failing_source_drains",
    "check_merged_sync_and_changes_only",
    "check_misdirected_writes_detected",
    "check_sync_after_training",
    "check_sync_casts",
    "check_sync_into_deep_sleep",
    "check_sync_to_another_device",
    "check_tied_embeddings",
    "trained_source",
]


class WeightSyncSuite(WeightSyncHooks[S]):
    """Conformance tests every ``WeightSync`` must pass (see ``lrft.api.WeightSync``)."""

    @pytest.fixture(scope="class")
    @classmethod
    def model_dir(cls, tmp_path_factory: pytest.TempPathFactory) -> Path:
        return cls._save_model(tmp_path_factory.mktemp("sync-model"), tied=False)

    @pytest.fixture(scope="class")
    @classmethod
    def tied_model_dir(cls, tmp_path_factory: pytest.TempPathFactory) -> Path:
        return cls._save_model(tmp_path_factory.mktemp("sync-model-tied"), tied=True)

    @classmethod
    def _save_model(cls, directory: Path, *, tied: bool) -> Path:
        q, kv = cls.model_heads
        return save_tiny_causal_lm(
            directory,
            seed=0,
            num_attention_heads=q,
            num_key_value_heads=kv,
            tie_word_embeddings=tied,
        )

    def test_sync_after_training_matches_trainer_and_reference(
        self, pool: RankPool, model_dir: Path
    ) -> None:
        pool.run(check_sync_after_training, type(self), model_dir, self.engine_dtype)

    def test_sync_into_level_2_asleep_engine_wakes_weights_only(
        self, pool: RankPool, model_dir: Path
    ) -> None:
        pool.run(check_sync_into_deep_sleep, type(self), model_dir)

    def test_cast_to_bfloat16_is_exact(self, pool: RankPool, model_dir: Path) -> None:
        pool.run(check_sync_casts, type(self), model_dir)

    def test_tied_embeddings(self, pool: RankPool, tied_model_dir: Path) -> None:
        pool.run(check_tied_embeddings, type(self), tied_model_dir)

    def test_corruption_in_transit_fails_and_leaves_engine_stale(
        self, pool: RankPool, model_dir: Path
    ) -> None:
        pool.run(check_corruption_detected, type(self), model_dir)

    def test_failed_stream_never_leaves_engine_fresh(self, pool: RankPool, model_dir: Path) -> None:
        pool.run(check_failing_source_drains, type(self), model_dir, only_first_group=False)

    def test_failure_on_one_group_drains_and_leaves_the_others_fresh(
        self, pool: RankPool, model_dir: Path
    ) -> None:
        if self.world_size <= self.tp_size:
            pytest.skip(
                f"needs two TP groups: world_size {self.world_size}, tp_size {self.tp_size}"
            )
        pool.run(check_failing_source_drains, type(self), model_dir, only_first_group=True)

    def test_in_place_writes_that_miss_fail_and_leave_engine_stale(
        self, pool: RankPool, model_dir: Path
    ) -> None:
        pool.run(check_misdirected_writes_detected, type(self), model_dir)

    def test_sync_to_an_engine_on_another_device(self, pool: RankPool, model_dir: Path) -> None:
        pool.run(check_sync_to_another_device, type(self), model_dir)

    def test_lora_source_is_merged_and_sends_changes_only(
        self, pool: RankPool, model_dir: Path
    ) -> None:
        pool.run(check_merged_sync_and_changes_only, type(self), model_dir)
