"""The direct sync's two verified paths on the CPU: into an engine that loads in place (the hf
engine) each bucket is written straight into the lent storage, never through the engine's batch
copy; through a loader that lends nothing it takes the digest-buffer path. Both leave the same
weights (torch's casts of what was sent) and report the same digest, the combined fingerprint of
those casts computed independently by ``tensor_digests``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import pytest
import torch

from lrft.api import InPlaceWeightLoader, RolloutEngine, WeightLoader, combine_digests
from lrft.api.digest import tensor_digests
from lrft.api.errors import WeightSyncError
from lrft.api.protocols import NamedTensors
from lrft.api.types import SyncReport
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.backends.sync import DirectSync
from lrft.testing.conformance.sync import LoaderProxy
from lrft.testing.models import tiny_causal_lm


class _Weights:
    """A ``WeightSource`` over fixed tensors, in buckets of at most ``bucket_bytes``."""

    def __init__(self, named: dict[str, torch.Tensor]) -> None:
        self.named = named

    def full_weights(
        self, bucket_bytes: int, *, gather_dtype: torch.dtype | None = None
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        bucket: list[tuple[str, torch.Tensor]] = []
        size = 0
        for name, tensor in self.named.items():
            nbytes = tensor.numel() * tensor.element_size()
            if bucket and size + nbytes > bucket_bytes:
                yield bucket
                bucket, size = [], 0
            bucket.append((name, tensor))
            size += nbytes
        if bucket:
            yield bucket


class _LendsNothing(LoaderProxy):
    """The engine, with its loader reduced to a plain function (no storage lent)."""

    def wrap(self, load: WeightLoader) -> WeightLoader:
        def plain(named_tensors: NamedTensors) -> None:
            load(named_tensors)

        return plain


@pytest.fixture
def source() -> _Weights:
    trained = tiny_causal_lm(3)
    return _Weights({n: p.detach().clone() for n, p in trained.named_parameters()})


def _engine() -> HFRolloutEngine:
    config = HFEngineConfig(dtype=torch.bfloat16, device=torch.device("cpu"))
    return HFRolloutEngine(tiny_causal_lm(0), config=config)


def _held(engine: HFRolloutEngine) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in engine.model.named_parameters()}


def test_a_verified_sync_writes_in_place_and_reports_the_casts_digest(
    source: _Weights, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _engine()
    with engine.weight_update(0) as load:
        assert isinstance(load, InPlaceWeightLoader)

    def no_batch_copy(batch: list[tuple[str, torch.Tensor]]) -> None:
        raise AssertionError(f"the engine's batch copy ran for {len(batch)} tensors")

    monkeypatch.setattr(engine, "_copy", no_batch_copy)
    report = DirectSync(bucket_bytes=4 * 1024).sync(source, engine, version=3)
    casts = {name: tensor.to(torch.bfloat16) for name, tensor in source.named.items()}
    held = _held(engine)
    assert all(torch.equal(held[name], value) for name, value in casts.items())
    assert engine.weights_version == 3
    assert report.verified
    assert report.buckets > 1
    assert report.digest == combine_digests(tensor_digests(casts))


def test_a_verified_sync_through_a_plain_loader_agrees(source: _Weights) -> None:
    in_place, plain = _engine(), _engine()
    first = DirectSync(bucket_bytes=4 * 1024).sync(source, in_place, version=1)
    second = DirectSync(bucket_bytes=4 * 1024).sync(
        source, cast(RolloutEngine, _LendsNothing(plain)), version=1
    )
    assert first.digest == second.digest
    assert plain.weights_version == 1
    held_in_place, held_plain = _held(in_place), _held(plain)
    assert all(torch.equal(held_in_place[name], held_plain[name]) for name in held_plain)


def test_a_repeated_sync_loads_the_new_values_also_after_the_storage_moved(
    source: _Weights,
) -> None:
    # One DirectSync keeps a copy plan per bucket: reused when the tensors are where they were
    # (new values at the same addresses), made again when the engine's storage moved.
    engine, sync = _engine(), DirectSync(bucket_bytes=4 * 1024)
    sync.sync(source, engine, version=1)
    for step in (2, 3):
        if step == 3:
            engine.sleep(2)  # the weights are released: waking allocates a new buffer
            engine.wake()
        for tensor in source.named.values():
            tensor.mul_(-0.5).add_(step)  # new values at the same addresses
        sync_and_check(sync, source, engine, step)


def sync_and_check(
    sync: DirectSync, source: _Weights, engine: HFRolloutEngine, version: int
) -> SyncReport:
    """Syncs ``version``; the engine then holds torch's bf16 casts of what was sent, and the
    report names their combined digest."""
    report = sync.sync(source, engine, version=version)
    casts = {name: tensor.to(torch.bfloat16) for name, tensor in source.named.items()}
    held = _held(engine)
    assert all(torch.equal(held[name], value) for name, value in casts.items()), version
    assert report.digest == combine_digests(tensor_digests(casts)), version
    assert engine.weights_version == version
    return report


class _Renamed(_Weights):
    """The same weights with the first tensor of the last bucket sent again, under an earlier
    bucket's name."""

    def full_weights(
        self, bucket_bytes: int, *, gather_dtype: torch.dtype | None = None
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        buckets = list(super().full_weights(bucket_bytes, gather_dtype=gather_dtype))
        first_name = buckets[0][0][0]
        (_, tensor), *rest = buckets[-1]
        buckets[-1] = [(first_name, tensor), *rest]
        yield from buckets


@pytest.mark.parametrize("verify", [True, False])
def test_a_sync_that_remembers_its_buckets_still_checks_each_sync(
    source: _Weights, verify: bool
) -> None:
    # The second sync of one DirectSync finds every bucket remembered; what changed since must
    # still be refused, and leave the engine stale.
    engine, sync = _engine(), DirectSync(bucket_bytes=4 * 1024, verify=verify)
    sync.sync(source, engine, version=1)
    name, good = next(iter(source.named.items()))
    source.named[name] = good.reshape(-1)[:-1].clone()
    with pytest.raises(WeightSyncError, match=f"weight {name!r}: trainer shape"):
        sync.sync(source, engine, version=2)
    assert engine.weights_version is None
    source.named[name] = good
    with pytest.raises(WeightSyncError, match=f"weight {name!r} was sent twice"):
        sync.sync(_Renamed(source.named), engine, version=3)
    assert engine.weights_version is None
    sync.sync(source, engine, version=4)
    assert engine.weights_version == 4


def test_a_sync_follows_new_source_tensors_and_another_engine(source: _Weights) -> None:
    sync = DirectSync(bucket_bytes=4 * 1024)
    first, second = _engine(), _engine()
    sync.sync(source, first, version=1)
    # new tensors at new addresses (a trainer that replaced its parameters), new values
    source.named = {name: (t * 3 - 1).requires_grad_() for name, t in source.named.items()}
    for engine in (first, second):
        report = sync.sync(source, engine, version=2)
        casts = {name: t.detach().to(torch.bfloat16) for name, t in source.named.items()}
        held = dict(engine.model.named_parameters())
        assert all(torch.equal(held[name], value) for name, value in casts.items())
        # copies of parameters that require grad record no autograd history in the engine
        assert not any(p.requires_grad or p.grad_fn is not None for p in held.values())
        assert report.digest == combine_digests(tensor_digests(casts))
