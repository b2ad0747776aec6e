"""The SplitWeightSync suite has teeth: a broadcast sync with one fault fails the suite's test
named with it, with a message that says what is wrong.

The broken syncs are :class:`NaiveBroadcast` (a plain broadcast of each bucket, which checks and
verifies nothing itself, so that only the suite can catch its faults) with one fault each: it
drops a bucket, labels the engines' weights with another version, sends the weights to one
rollout rank only, or writes into an engine while a generation runs on it. The naive sync
without a fault passes the same tests: the suite fails the faults, not the lack of checks.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import ClassVar, cast

import pytest
import torch

from lrft.api import RolloutEngine, SyncCapabilities, SyncReport, WeightSource
from lrft.backends.sync._broadcast_wire import BucketHeader, pack, unpack
from lrft.backends.sync.broadcast import BroadcastSync
from lrft.dist import SplitGroups, SplitLayout
from lrft.dist.split import SENDER
from lrft.testing.distributed import RankFailure, RankPool, shared_pool
from lrft.testing.models import save_tiny_causal_lm
from tests.conformance.test_broadcast_sync import BroadcastSyncSuite


class NaiveBroadcast:
    """Each gathered bucket broadcast from the sender and loaded on every rollout rank; no check
    of its own (it declares no verification). Subclasses add one fault each."""

    def __init__(self, groups: SplitGroups, bucket_bytes: int) -> None:
        self.groups = groups
        self.bucket_bytes = bucket_bytes
        self._lock = threading.Lock()

    @property
    def capabilities(self) -> SyncCapabilities:
        return SyncCapabilities(cross_device=True)

    @contextmanager
    def serving(self, engine: RolloutEngine) -> Iterator[None]:
        with self.guard():
            yield

    def guard(self) -> AbstractContextManager[object]:
        """What excludes syncs from generations on this rank's engine."""
        return self._lock

    def sends(self, index: int) -> bool:
        """Whether the sender broadcasts bucket ``index``."""
        return True

    def label(self, version: int) -> int:
        """The version the engines are told."""
        return version

    def loads_here(self) -> bool:
        """Whether this rollout rank writes what arrives into its engine."""
        return True

    def sync(
        self, source: WeightSource | None, engine: RolloutEngine | None, *, version: int
    ) -> SyncReport:
        span = self.groups.weights
        buckets = tensors = 0
        if source is not None:
            for index, bucket in enumerate(source.full_weights(self.bucket_bytes)):
                if not self.sends(index):
                    continue
                buckets, tensors = buckets + 1, tensors + len(bucket)
                if span is not None:
                    sent, buffer = pack([n for n, _ in bucket], [t for _, t in bucket], span.device)
                    span.broadcast_object(sent, SENDER)
                    span.broadcast(buffer, SENDER)
            if span is not None:
                span.broadcast_object("end", SENDER)
            return _report(version, tensors, buckets)
        assert engine is not None
        assert span is not None
        with self.guard(), torch.no_grad(), engine.weight_update(self.label(version)) as load:
            while True:
                message: BucketHeader | str = span.broadcast_object(None, SENDER)
                if not isinstance(message, BucketHeader):
                    break
                buffer = torch.empty(message.nbytes, dtype=torch.uint8, device=span.device)
                span.broadcast(buffer, SENDER)
                buckets, tensors = buckets + 1, tensors + len(message.names)
                if self.loads_here():
                    load(unpack(message, buffer))
        assert engine.weights_version is not None
        return _report(engine.weights_version, tensors, buckets)


def _report(version: int, tensors: int, buckets: int) -> SyncReport:
    return SyncReport(
        version=version,
        tensors=tensors,
        bytes=0,
        buckets=buckets,
        seconds=0.0,
        verified=False,
        digest="",
    )


class DropsABucket(NaiveBroadcast):
    def sends(self, index: int) -> bool:
        return index != 1


class MislabelsTheVersion(NaiveBroadcast):
    def label(self, version: int) -> int:
        return version + 1


class SendsToOneRankOnly(NaiveBroadcast):
    def loads_here(self) -> bool:
        return self.groups.rank == self.groups.layout.rollout_ranks[0]


class WritesWhileGenerating(NaiveBroadcast):
    def guard(self) -> AbstractContextManager[object]:
        return nullcontext()


# --- suites around them (module level: the pool's workers import them by name) -----------------


class _Naive(BroadcastSyncSuite):
    sync_class: ClassVar[type[NaiveBroadcast]] = NaiveBroadcast

    @classmethod
    def make_split_sync(cls, groups: SplitGroups, bucket_bytes: int) -> BroadcastSync:
        return cast(BroadcastSync, cls.sync_class(groups, bucket_bytes))


class NaiveSuite(_Naive):
    world_size = 3
    rollout_world_size = 2
    tp_size = 2


class DropsABucketSuite(NaiveSuite):
    sync_class = DropsABucket


class MislabelsTheVersionSuite(NaiveSuite):
    sync_class = MislabelsTheVersion


class SendsToOneRankOnlySuite(NaiveSuite):
    sync_class = SendsToOneRankOnly


class WritesWhileGeneratingSuite(NaiveSuite):
    sync_class = WritesWhileGenerating


LAYOUT = SplitLayout(world_size=3, rollout_world_size=2, tp_size=2)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_causal_lm(tmp_path_factory.mktemp("split-teeth-model"), seed=0)


@pytest.fixture
def pool() -> RankPool:
    return shared_pool(LAYOUT.world_size, split=LAYOUT)


def test_the_naive_sync_without_a_fault_passes(pool: RankPool, model_dir: Path) -> None:
    NaiveSuite().test_sync_after_training_reaches_every_rollout_rank(pool, model_dir)
    NaiveSuite().test_no_weight_is_written_while_a_generation_runs(pool, model_dir)


def test_a_dropped_bucket_fails(pool: RankPool, model_dir: Path) -> None:
    with pytest.raises(
        RankFailure,
        match=r"rank 1 \(rollout rank 0 of 2, TP group \(1, 2\)\): the engine's weights_digest\(\) "
        r"differ from the trainer's for \d+ of \d+ tensors",
    ):
        DropsABucketSuite().test_sync_after_training_reaches_every_rollout_rank(pool, model_dir)


def test_a_mislabelled_version_fails(pool: RankPool, model_dir: Path) -> None:
    with pytest.raises(
        RankFailure,
        match=r"rank 1 \(rollout rank 0 .*\): the engine serves version 8 after a sync to 7",
    ):
        MislabelsTheVersionSuite().test_sync_after_training_reaches_every_rollout_rank(
            pool, model_dir
        )


def test_weights_sent_to_one_rank_only_fail(pool: RankPool, model_dir: Path) -> None:
    with pytest.raises(
        RankFailure,
        match=r"rank 2 \(rollout rank 1 of 2, TP group \(1, 2\)\): the engine still holds the "
        r"weights it had before the sync",
    ):
        SendsToOneRankOnlySuite().test_sync_after_training_reaches_every_rollout_rank(
            pool, model_dir
        )


def test_writing_while_a_generation_runs_fails(pool: RankPool, model_dir: Path) -> None:
    with pytest.raises(
        RankFailure,
        match=r"the sync loaded \d+ batch\(es\) of weights into the engine while a generation "
        r"was running on it \(inside serving\(\)\): that generation read half-written weights",
    ):
        WritesWhileGeneratingSuite().test_no_weight_is_written_while_a_generation_runs(
            pool, model_dir
        )
