"""``SplitWeightSyncSuite[S]``: the conformance tests of a ``SplitWeightSync``, whose trainer and
engines live on different ranks of a split placement (:class:`lrft.dist.SplitLayout`).

A subclass says how to build the sync from this rank's split groups, and, as for
``WeightSyncSuite``, the train backend that feeds it, the engine it fills and a backdoor into
the engine's weights::

    class TestBroadcastWorld3(SplitWeightSyncSuite[BroadcastSync]):
        world_size = 3
        rollout_world_size = 2
        tp_size = 2

        @classmethod
        def make_split_sync(cls, groups: SplitGroups, bucket_bytes: int) -> BroadcastSync:
            return BroadcastSync(groups=groups, bucket_bytes=bucket_bytes)
        ...

The ranks start split: the first ``world_size - rollout_world_size`` train (their own group is
their default process group, over which the source is sharded), the others hold the engines.
Rank-side checks return what they saw and the test compares the two sides: the trainer's report
against what every engine holds. The reference is the trainer's own weights, read through
``full_weights`` (or, for a LoRA source, the plain merge of its parameters) and handed to the
rollout ranks through the pool's shared folder, never through the sync under test; the engines'
greedy tokens are compared with a plain transformers model holding them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, cast

import pytest

from lrft.dist import SplitGroups, SplitLayout
from lrft.testing.conformance._split_sync_checks import (
    check_split_casts,
    check_split_corruption_on_one_rank,
    check_split_failing_source,
    check_split_sync,
    compare_sides,
)
from lrft.testing.conformance._split_sync_serving import (
    check_split_generation_excludes_sync,
    check_split_vision_towers,
)
from lrft.testing.conformance._sync_hooks import S, WeightSyncHooks
from lrft.testing.distributed import (
    RankPool,
    current_split_groups,
    missing_devices,
    shared_pool,
)

__all__ = [
    "SplitWeightSyncSuite",
    "check_split_casts",
    "check_split_corruption_on_one_rank",
    "check_split_failing_source",
    "check_split_generation_excludes_sync",
    "check_split_sync",
    "check_split_vision_towers",
]


class SplitWeightSyncSuite(WeightSyncHooks[S]):
    """Conformance tests every ``SplitWeightSync`` must pass (see ``lrft.api.SplitWeightSync``).

    ``world_size`` ranks, the last ``rollout_world_size`` of them rolling out in TP groups of
    ``tp_size`` (engines that cannot span a TP group serve whole copies, and the group generates
    together through ``lrft.dist.tp_group_generate``).
    """

    rollout_world_size: ClassVar[int] = 1
    #: run the vision-tower check (a tiny Qwen2-VL source and engine)
    vision: ClassVar[bool] = False

    @classmethod
    def layout(cls) -> SplitLayout:
        return SplitLayout(
            world_size=cls.world_size,
            rollout_world_size=cls.rollout_world_size,
            tp_size=cls.tp_size,
        )

    @classmethod
    def make_split_sync(cls, groups: SplitGroups, bucket_bytes: int) -> S:
        """The sync under test on this rank, bounded to ``bucket_bytes`` per bucket."""
        raise NotImplementedError(f"{cls.__name__} must define make_split_sync")

    @classmethod
    def make_sync(cls, bucket_bytes: int) -> S:
        return cls.make_split_sync(current_split_groups(), bucket_bytes)

    @pytest.fixture
    def pool(self) -> RankPool:
        cls = type(self)
        if (missing := missing_devices(cls.world_size, cls.device_type)) is not None:
            pytest.skip(f"{cls.__name__} {missing}")
        return shared_pool(cls.world_size, cls.device_type, split=cls.layout())

    @pytest.fixture(scope="class")
    @classmethod
    def vlm_dir(cls, tmp_path_factory: pytest.TempPathFactory) -> Path:
        from lrft.testing.vision_models import save_tiny_vlm

        q, kv = cls.model_heads
        directory = tmp_path_factory.mktemp("split-sync-vlm")
        return save_tiny_vlm(directory, 0, num_attention_heads=q, num_key_value_heads=kv)

    def _run(self, pool: RankPool, check: Any, *args: object) -> list[dict[str, Any]]:
        return cast(list[dict[str, Any]], pool.run(check, type(self), *args))

    def test_sync_after_training_reaches_every_rollout_rank(
        self, pool: RankPool, model_dir: Path
    ) -> None:
        seen = self._run(pool, check_split_sync, model_dir, self.engine_dtype, "trained")
        compare_sides(self.layout(), seen)

    def test_sync_into_level_2_asleep_engines_wakes_weights_only(
        self, pool: RankPool, model_dir: Path
    ) -> None:
        compare_sides(self.layout(), self._run(pool, check_split_sync, model_dir, None, "asleep"))

    def test_tied_embeddings(self, pool: RankPool, tied_model_dir: Path) -> None:
        seen = self._run(pool, check_split_sync, tied_model_dir, None, "tied")
        compare_sides(self.layout(), seen)

    def test_cast_to_bfloat16_is_exact(self, pool: RankPool, model_dir: Path) -> None:
        self._run(pool, check_split_casts, model_dir)

    def test_corruption_on_one_rollout_rank_fails_there_and_names_it(
        self, pool: RankPool, model_dir: Path
    ) -> None:
        self._run(pool, check_split_corruption_on_one_rank, model_dir)

    def test_failed_stream_leaves_every_engine_stale(self, pool: RankPool, model_dir: Path) -> None:
        self._run(pool, check_split_failing_source, model_dir)

    def test_no_weight_is_written_while_a_generation_runs(
        self, pool: RankPool, model_dir: Path
    ) -> None:
        self._run(pool, check_split_generation_excludes_sync, model_dir)

    def test_vision_tower_goes_too(self, request: pytest.FixtureRequest, pool: RankPool) -> None:
        if not self.vision:
            pytest.skip(f"{type(self).__name__} does not run the vision-tower check (vision)")
        self._run(pool, check_split_vision_towers, request.getfixturevalue("vlm_dir"))
