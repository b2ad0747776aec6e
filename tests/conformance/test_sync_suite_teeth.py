"""The WeightSync suite has teeth, and passes correct syncs it used to fail.

Each broken sync is ``DirectSync`` behind a wrapper with one fault; each must fail the suite's
test named with it, with a message that says what is wrong. Two correct syncs that the suite
once failed pass: one that verifies without writing in place (``test_direct_sync.py`` runs the
whole suite on ``DirectSync(verify=False)`` too).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar, cast

import attrs
import pytest
import torch

from lrft.api import (
    RolloutEngine,
    SyncCapabilities,
    SyncReport,
    WeightLoader,
    WeightSource,
    WeightSyncError,
    combine_digests,
)
from lrft.api.protocols import NamedTensors
from lrft.backends.sync import DirectSync
from lrft.testing.conformance import sync as sync_checks
from lrft.testing.conformance.sync import LoaderProxy
from lrft.testing.distributed import DistributedSuite, RankFailure, RankPool, shared_pool
from lrft.testing.models import save_tiny_causal_lm
from tests.conformance.test_direct_sync import DirectSyncSuite

Bucket = list[tuple[str, torch.Tensor]]


class WrappedDirect:
    """``DirectSync`` behind a wrapper; subclasses inject one fault each."""

    verify: ClassVar[bool] = True

    def __init__(self, bucket_bytes: int) -> None:
        self._inner = DirectSync(bucket_bytes=bucket_bytes, verify=self.verify)

    @property
    def capabilities(self) -> SyncCapabilities:
        return self._inner.capabilities

    def sync(self, source: WeightSource, engine: RolloutEngine, *, version: int) -> SyncReport:
        return self._inner.sync(source, engine, version=version)


class ClaimsVerification(WrappedDirect):
    """Verifies nothing and declares nothing, yet reports ``verified=True``."""

    verify = False

    def sync(self, source: WeightSource, engine: RolloutEngine, *, version: int) -> SyncReport:
        return attrs.evolve(super().sync(source, engine, version=version), verified=True)


class DeclaresVerificationItSkips(ClaimsVerification):
    @property
    def capabilities(self) -> SyncCapabilities:
        return SyncCapabilities(verifies_digest=True)


class DigestsTheOldWeights(WrappedDirect):
    """Reports the combined digest of what the engine held before the sync."""

    def sync(self, source: WeightSource, engine: RolloutEngine, *, version: int) -> SyncReport:
        before = combine_digests(engine.weights_digest())
        return attrs.evolve(super().sync(source, engine, version=version), digest=before)


class _OneTensorPerCall(LoaderProxy):
    def wrap(self, load: WeightLoader) -> WeightLoader:
        def per_tensor(named_tensors: NamedTensors) -> None:
            for pair in named_tensors:
                load([pair])

        return per_tensor


class LoadsTensorByTensor(WrappedDirect):
    """Calls the engine once per tensor instead of once per bucket."""

    def sync(self, source: WeightSource, engine: RolloutEngine, *, version: int) -> SyncReport:
        return super().sync(source, cast(RolloutEngine, _OneTensorPerCall(engine)), version=version)


class _PlainLoader(LoaderProxy):
    def wrap(self, load: WeightLoader) -> WeightLoader:
        return lambda named_tensors: load(named_tensors)


class VerifiesWithoutWritingInPlace(WrappedDirect):
    """Correct: verifies, but loads every bucket through the plain loader (it never asks an
    ``InPlaceWeightLoader`` for targets)."""

    def sync(self, source: WeightSource, engine: RolloutEngine, *, version: int) -> SyncReport:
        return super().sync(source, cast(RolloutEngine, _PlainLoader(engine)), version=version)


class _ShapeChecked:
    def __init__(self, source: WeightSource, engine: RolloutEngine) -> None:
        self._source, self._specs = source, engine.parameter_specs()

    def full_weights(
        self, bucket_bytes: int, *, gather_dtype: torch.dtype | None = None
    ) -> Iterator[Bucket]:
        for bucket in self._source.full_weights(bucket_bytes, gather_dtype=gather_dtype):
            for name, tensor in bucket:
                if tuple(tensor.shape) != self._specs[name].shape:
                    raise WeightSyncError(f"{name} has shape {tuple(tensor.shape)}")
            yield bucket


class RaisesMidStream(WrappedDirect):
    """Checks shapes as buckets arrive and raises at the first bad one, leaving the rest of the
    stream untaken."""

    def sync(self, source: WeightSource, engine: RolloutEngine, *, version: int) -> SyncReport:
        return super().sync(_ShapeChecked(source, engine), engine, version=version)


class _UntiesTheStream:
    def __init__(self, source: WeightSource) -> None:
        self._source = source

    def full_weights(
        self, bucket_bytes: int, *, gather_dtype: torch.dtype | None = None
    ) -> Iterator[Bucket]:
        embedding = None
        for bucket in self._source.full_weights(bucket_bytes, gather_dtype=gather_dtype):
            embedding = dict(bucket).get("model.embed_tokens.weight", embedding)
            yield bucket
        if embedding is not None:
            yield [("lm_head.weight", embedding)]


class SendsTiedWeightsTwice(WrappedDirect):
    """Sends the output embedding under its own name too, as a state dict names it."""

    def sync(self, source: WeightSource, engine: RolloutEngine, *, version: int) -> SyncReport:
        return super().sync(_UntiesTheStream(source), engine, version=version)


# --- suites around them (module level: the pool's workers import them by name) -----------------


class _Wrapped(DirectSyncSuite):
    sync_class: ClassVar[type[WrappedDirect]] = WrappedDirect

    @classmethod
    def make_sync(cls, bucket_bytes: int) -> DirectSync:
        return cast(DirectSync, cls.sync_class(bucket_bytes))


class ClaimsVerificationSuite(_Wrapped):
    sync_class = ClaimsVerification


class DeclaresVerificationItSkipsSuite(_Wrapped):
    sync_class = DeclaresVerificationItSkips


class DigestsTheOldWeightsSuite(_Wrapped):
    sync_class = DigestsTheOldWeights


class LoadsTensorByTensorSuite(_Wrapped):
    sync_class = LoadsTensorByTensor


class VerifiesWithoutWritingInPlaceSuite(_Wrapped):
    sync_class = VerifiesWithoutWritingInPlace


class RaisesMidStreamSuite(_Wrapped):
    world_size = 2
    sync_class = RaisesMidStream


class SendsTiedWeightsTwiceSuite(_Wrapped):
    sync_class = SendsTiedWeightsTwice


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_causal_lm(tmp_path_factory.mktemp("sync-teeth-model"), seed=0)


@pytest.fixture(scope="module")
def tied_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("sync-teeth-model-tied")
    return save_tiny_causal_lm(directory, seed=0, tie_word_embeddings=True)


class TestSyncSuiteTeethWorld1(DistributedSuite):
    world_size = 1

    def test_a_claimed_verification_fails(self, pool: RankPool, model_dir: Path) -> None:
        with pytest.raises(
            RankFailure,
            match=r"report\.verified is True, but the sync does not declare the capability "
            r"verifies_digest",
        ):
            ClaimsVerificationSuite().run_check(
                pool, sync_checks.check_sync_after_training, model_dir
            )

    def test_a_declared_verification_must_catch_corruption(
        self, pool: RankPool, model_dir: Path
    ) -> None:
        suite = DeclaresVerificationItSkipsSuite()
        with pytest.raises(
            RankFailure,
            match=r"a verifying sync through CorruptInTransit \(Perturbs the first tensor of "
            r"every loaded batch, as a faulty transport would\) did not raise WeightSyncError",
        ):
            suite.run_check(pool, sync_checks.check_corruption_detected, model_dir)

    def test_a_digest_of_something_else_fails(self, pool: RankPool, model_dir: Path) -> None:
        with pytest.raises(
            RankFailure,
            match=r"report\.digest is '[0-9a-f]{32}', but combine_digests\(\) of the digests of "
            r"what was sent \(cast to the engine's dtypes\) is '[0-9a-f]{32}'",
        ):
            DigestsTheOldWeightsSuite().run_check(
                pool, sync_checks.check_sync_after_training, model_dir
            )

    def test_one_engine_call_per_tensor_fails(self, pool: RankPool, model_dir: Path) -> None:
        with pytest.raises(
            RankFailure,
            match=r"the sync made 27 calls into the engine to load \d+ buckets \(27 tensors\): "
            r"at most one per bucket",
        ):
            LoadsTensorByTensorSuite().run_check(
                pool, sync_checks.check_sync_after_training, model_dir
            )

    def test_a_stream_left_undrained_fails(self, pool: RankPool, model_dir: Path) -> None:
        with pytest.raises(
            RankFailure,
            match=r"the sync raised after taking 1 of \d+ buckets: it must take the whole stream",
        ):
            RaisesMidStreamSuite().run_check(
                pool, sync_checks.check_failing_source_drains, model_dir
            )

    def test_tied_weights_sent_twice_fail(self, pool: RankPool, tied_model_dir: Path) -> None:
        with pytest.raises(
            RankFailure,
            match=r"syncing a model whose input and output embeddings are tied failed: the engine "
            r"has no weight 'lm_head\.weight'",
        ):
            SendsTiedWeightsTwiceSuite().run_check(
                pool, sync_checks.check_tied_embeddings, tied_model_dir
            )

    def test_a_verifying_sync_that_never_writes_in_place_is_not_failed(
        self, pool: RankPool, model_dir: Path
    ) -> None:
        suite = VerifiesWithoutWritingInPlaceSuite()
        with pytest.raises(pytest.skip.Exception, match=r"the sync never wrote in place"):
            suite.run_check(pool, sync_checks.check_misdirected_writes_detected, model_dir)
        suite.run_check(pool, sync_checks.check_sync_after_training, model_dir)
        suite.run_check(pool, sync_checks.check_corruption_detected, model_dir)


def test_failure_on_one_rank_that_leaves_the_stream_undrained_names_it(model_dir: Path) -> None:
    """At world 2 only rank 0's source is broken: a sync that raises without taking the rest of
    the stream would leave rank 1 waiting in the gather; the check finishes the stream for it
    and fails on rank 0 alone."""
    with pytest.raises(
        RankFailure,
        match=r"(?s)failed on 1 of 2 ranks \(raised: 0\).*the sync raised after taking 1 of \d+ "
        r"buckets",
    ):
        RaisesMidStreamSuite().run_check(
            shared_pool(2), sync_checks.check_failure_on_one_group_drains, model_dir
        )
