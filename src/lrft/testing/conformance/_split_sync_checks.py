"""The rank-side checks of ``SplitWeightSyncSuite``: each takes the suite class (for its hooks)
and plain arguments, runs on every rank of a split pool (``lrft.testing.distributed``), and
returns what its side saw for :func:`compare_sides` to hold against the other side."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import pytest
import torch

from lrft.api import (
    GenerationRequest,
    RolloutEngine,
    SamplingParams,
    SplitWeightSync,
    StaleWeightsError,
    SyncReport,
    TrainableModel,
    WeightSource,
    WeightSyncError,
    combine_digests,
)
from lrft.api.digest import tensor_digests
from lrft.dist import SplitLayout, tp_group_generate
from lrft.dist.split import SENDER
from lrft.testing.conformance._sync_checks import (
    NEW_TOKENS,
    PROMPTS,
    _assert_digests,
    _expected_digests,
    _gathered,
    _greedy,
    _stored_dtypes,
    trained_source,
)
from lrft.testing.conformance._sync_hooks import WeightSyncHooks
from lrft.testing.conformance._sync_proxies import CorruptInTransit, CountsEngineCalls, StreamProbe
from lrft.testing.conformance.expect import raises
from lrft.testing.distributed import current_rank_context, current_split_groups
from lrft.testing.reference import greedy_continuation, model_with_weights

Suite = type[WeightSyncHooks[Any]]
Seen = dict[str, Any]


def where() -> str:
    """This rank, its role and its place, for messages."""
    groups = current_split_groups()
    return groups.layout.describe(groups.rank)


def split_sync(suite: Suite, bucket_bytes: int) -> SplitWeightSync:
    sync = suite.make_sync(bucket_bytes)
    assert isinstance(sync, SplitWeightSync), (
        f"{type(sync).__name__} lacks members of the SplitWeightSync Protocol (lrft.api): a sync "
        "between the roles of a split placement also says when generation may read its engine "
        "(serving)"
    )
    return sync


def agreed(value: object) -> Any:
    """The first rollout rank's ``value`` on every rank (through the pool's exchange group and
    the trainer group, never the sync under test): for decisions both sides must take alike."""
    groups = current_split_groups()
    first = groups.layout.rollout_ranks[0]
    if groups.exchange is not None:
        value = groups.exchange.broadcast_object(value if groups.rank == first else None, first)
    if groups.role == "train" and groups.layout.train_world_size > 1:
        from lrft.dist import broadcast_object

        value = broadcast_object((value,), src=SENDER)[0]
    return value


def handoff(suite: Suite, name: str) -> Path:
    """Where the sender leaves the reference weights for the rollout ranks (the pool's folder)."""
    return current_rank_context().shared_dir / f"{suite.__name__}-{name}.pt"


def reference_weights(suite: Suite, source: TrainableModel) -> dict[str, torch.Tensor]:
    """What the engines must hold: the trainer's full weights, or a LoRA source's plain merge.
    Collective over the trainer group."""
    if not suite.lora:
        return _gathered(source)
    parameters = {
        name: tensor.detach().to("cpu", copy=True)
        for name, tensor in suite.source_parameters(source).items()
    }
    return suite.expected_weights(parameters)


def send(
    suite: Suite, source: WeightSource, expected: Mapping[str, torch.Tensor], *, version: int
) -> SyncReport:
    """The trainer side of one sync, with the reference left for the rollout ranks first."""
    if current_split_groups().is_sender:
        torch.save(dict(expected), handoff(suite, f"v{version}"))
    return split_sync(suite, 3 * 1024).sync(source, None, version=version)


def report_fields(report: SyncReport) -> dict[str, Any]:
    return {
        "version": report.version,
        "tensors": report.tensors,
        "buckets": report.buckets,
        "verified": report.verified,
        "digest": report.digest,
    }


def assert_holds(
    engine: RolloutEngine,
    suite: Suite,
    expected: Mapping[str, torch.Tensor],
    before: Mapping[str, str],
) -> None:
    """The engine holds ``expected`` (cast to its dtypes), by its digest and the backdoor."""
    want = _expected_digests(engine, expected)
    held = engine.weights_digest()
    if held == dict(before) and held != want:
        raise AssertionError(
            f"{where()}: the engine still holds the weights it had before the sync (none of "
            f"the {len(want)} trainer weights reached it)"
        )
    _assert_digests(held, want, f"{where()}: the engine's weights_digest()")
    backdoor = tensor_digests(suite.read_engine_weights(engine))
    _assert_digests(backdoor, want, f"{where()}: the engine's weights read through the backdoor")


def assert_group_greedy(
    engine: RolloutEngine, model_dir: Path, weights: Mapping[str, torch.Tensor]
) -> None:
    """The TP group generates together; each rank gets greedy tokens of a plain model holding
    ``weights`` for its own prompts."""
    groups = current_split_groups()
    mine = PROMPTS[groups.rank % len(PROMPTS) :] + PROMPTS[: groups.rank % len(PROMPTS)]
    requests = [
        GenerationRequest(prompt_token_ids=p, request_id=f"{groups.rank}-{i}")
        for i, p in enumerate(mine)
    ]
    params = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS)
    got = [
        r.output_token_ids
        for r in tp_group_generate(engine.generate, requests, params, groups.tp_group)
    ]
    model = model_with_weights(model_dir, weights)
    want = [tuple(greedy_continuation(model, prompt, NEW_TOKENS)) for prompt in mine]
    assert got == want, (
        f"{where()}: after the sync its TP group's greedy tokens {got} differ from those of a "
        f"plain model holding the trainer's weights, {want}"
    )


def check_split_sync(suite: Suite, model_dir: Path, dtype: torch.dtype | None, mode: str) -> Seen:
    """One sync of a trained source at version 7; ``mode``: ``trained`` (into engines of
    ``dtype``), ``asleep`` (engines asleep at level 2 first) or ``tied`` (tied embeddings)."""
    groups = current_split_groups()
    if groups.role == "train":
        can = agreed(None)
        if mode == "asleep" and not can:
            pytest.skip("the engine lacks capability sleep_level_2")
        source = trained_source(suite, tied=mode == "tied")
        expected = reference_weights(suite, source)
        probe = StreamProbe(source)
        report = send(suite, probe, expected, version=7)
        left = probe.rest()
        assert left == 0, f"{where()}: the sync left {left} buckets of the stream untaken"
        assert report.version == 7, f"{where()}: report.version {report.version}, asked for 7"
        assert report.tensors == len(expected), (
            f"{where()}: report.tensors {report.tensors}, the trainer has {len(expected)} weights"
        )
        assert report.buckets == probe.taken > 1, (
            f"{where()}: report.buckets {report.buckets}; the source yielded {probe.taken} "
            "buckets, and a 3 KiB bound must split the model into several"
        )
        return {"role": "train", "rank": groups.rank, **report_fields(report)}
    engine = suite.make_engine(model_dir, dtype or torch.float32, current_rank_context().device)
    with engine:
        can = "sleep_level_2" in engine.capabilities.names()
        agreed(can)
        if mode == "asleep" and not can:
            pytest.skip(f"{engine.name} engine lacks capability sleep_level_2")
        before = engine.weights_digest()
        if mode == "asleep":
            engine.sleep(2)
        counted = CountsEngineCalls(engine)
        report = split_sync(suite, 3 * 1024).sync(None, cast(RolloutEngine, counted), version=7)
        expected = torch.load(handoff(suite, "v7"))
        if mode == "asleep":
            state = engine.state
            assert not state.kv_cache_resident, f"{where()}: the sync woke the KV cache: {state}"
            engine.wake()
        assert engine.weights_version == 7, (
            f"{where()}: the engine serves version {engine.weights_version} after a sync to 7"
        )
        assert report.version == 7, f"{where()}: report.version {report.version}, asked for 7"
        assert_holds(engine, suite, expected, before)
        assert counted.calls <= report.buckets, (
            f"{where()}: the sync made {counted.calls} calls into the engine to load "
            f"{report.buckets} buckets: at most one per bucket"
        )
        if all(d == torch.float32 for d in _stored_dtypes(engine, expected).values()):
            assert_group_greedy(engine, model_dir, expected)
        digest = combine_digests(_expected_digests(engine, expected))
    return {
        "role": "rollout",
        "rank": groups.rank,
        "expected_digest": digest,
        **report_fields(report),
    }


def compare_sides(layout: SplitLayout, seen: list[Seen]) -> None:
    """Every trainer rank reports one sync; every rollout rank took that sync, and the digest
    the trainer reports is the one of what the engines must hold."""
    trainers = [s for s in seen if s["role"] == "train"]
    rollouts = [s for s in seen if s["role"] == "rollout"]
    first = trainers[0]
    for other in trainers[1:]:
        same = {k: other[k] for k in ("version", "digest", "buckets", "tensors")}
        assert same == {k: first[k] for k in same}, (
            f"trainer ranks disagree on the sync's report: {layout.describe(0)} says "
            f"{ {k: first[k] for k in same} }, {layout.describe(other['rank'])} says {same}"
        )
    for rollout in rollouts:
        name = layout.describe(rollout["rank"])
        assert rollout["buckets"] == first["buckets"], (
            f"{name} took {rollout['buckets']} buckets, the trainer sent {first['buckets']}"
        )
        if first["verified"]:
            assert first["digest"] == rollout["expected_digest"], (
                f"the trainer's report.digest {first['digest']} is not combine_digests() of what "
                f"{name} must hold, {rollout['expected_digest']}"
            )


def check_split_casts(suite: Suite, model_dir: Path) -> None:
    """Into bfloat16 engines, each weight is exactly the trainer's tensor cast."""
    groups = current_split_groups()
    if groups.role == "train":
        source = trained_source(suite, steps=1)
        send(suite, source, reference_weights(suite, source), version=1)
        return
    with suite.make_engine(model_dir, torch.bfloat16, current_rank_context().device) as engine:
        split_sync(suite, 3 * 1024).sync(None, engine, version=1)
        expected = torch.load(handoff(suite, "v1"))
        declared = _stored_dtypes(engine, expected)
        held = suite.read_engine_weights(engine)
        for name, tensor in expected.items():
            stored = held[name].to("cpu")
            cast_ = tensor.to(declared[name])
            if stored.dtype != declared[name] or not torch.equal(stored, cast_):
                raise AssertionError(
                    f"{where()}: {name} is stored as {stored.dtype}, not the trainer's tensor "
                    f"cast to {declared[name]} (parameter_specs())"
                )


def check_split_corruption_on_one_rank(suite: Suite, model_dir: Path) -> None:
    """Corruption on the first rollout rank fails the sync there (its engine stale) and on
    every trainer rank, naming that rank; the other rollout ranks take the weights."""
    groups = current_split_groups()
    layout = groups.layout
    first = layout.rollout_ranks[0]
    if "verifies_digest" not in suite.make_sync(1 << 20).capabilities.names():
        pytest.skip("sync lacks capability verifies_digest")
    doing = f"a sync whose weights are corrupted on their way into {layout.describe(first)}"
    if groups.role == "train":
        source = trained_source(suite, steps=1)
        with raises(WeightSyncError, f"{where()}: {doing}") as raised:
            send(suite, source, reference_weights(suite, source), version=5)
        assert layout.describe(first) in str(raised.value), (
            f"{where()}: the sync failed, as it must, but its message does not name the rank "
            f"that failed ({layout.describe(first)}): {raised.value}"
        )
        return
    with suite.make_engine(model_dir, torch.float32, current_rank_context().device) as engine:
        before = engine.weights_digest()
        sync = split_sync(suite, 3 * 1024)
        if groups.rank == first:
            with raises(WeightSyncError, f"{where()}: {doing}", match="differ"):
                sync.sync(None, cast(RolloutEngine, CorruptInTransit(engine)), version=5)
            assert engine.weights_version is None, (
                f"{where()}: a failed sync left the engine looking fresh"
            )
            with raises(StaleWeightsError, f"{where()}: generate() after a failed sync"):
                _greedy(engine)
            return
        sync.sync(None, engine, version=5)
        assert engine.weights_version == 5, (
            f"{where()}: its weights were intact, yet its engine serves version "
            f"{engine.weights_version} after the sync, not 5"
        )
        assert_holds(engine, suite, torch.load(handoff(suite, "v5")), before)


def check_split_failing_source(suite: Suite, model_dir: Path) -> None:
    """A source whose first tensor is misshapen fails the sync on every rank, after the trainer
    ranks took the whole stream, and leaves every engine stale."""
    groups = current_split_groups()
    doing = "a sync from a source whose first tensor is misshapen"
    if groups.role == "train":
        probe = StreamProbe(trained_source(suite, steps=1), misshapen_head=True)
        try:
            with raises(WeightSyncError, f"{where()}: {doing}"):
                split_sync(suite, 4 * 1024).sync(probe, None, version=3)
        finally:
            left = probe.rest()
        assert left == 0, (
            f"{where()}: the sync raised after taking {probe.taken} of {probe.taken + left} "
            "buckets: it must take the whole stream (the other trainer ranks gather it too)"
        )
        return
    with suite.make_engine(model_dir, torch.float32, current_rank_context().device) as engine:
        with raises(WeightSyncError, f"{where()}: {doing}"):
            split_sync(suite, 4 * 1024).sync(None, engine, version=3)
        assert engine.weights_version is None, (
            f"{where()}: the sender's stream failed, yet the engine looks fresh "
            f"(version {engine.weights_version})"
        )
        with raises(StaleWeightsError, f"{where()}: generate() after a failed sync"):
            _greedy(engine)
