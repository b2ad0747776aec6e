"""The rank-side checks of ``WeightSyncSuite`` for a LoRA source: the engine holds the plain
merge of the source's parameters (computed in the test, with neither peft's merge nor lrft's),
and a sync that declares ``sends_changes_only`` sends only the adapted weights while the engine
still holds the rest, and every weight again once it lost them (sleep level 2) or loaded others.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from lrft.api import IncrementalWeightSource, RolloutEngine, SyncReport, TrainableModel, WeightSync
from lrft.api.digest import tensor_digests
from lrft.testing.conformance._registry import SYNC_CHECKS
from lrft.testing.conformance._sync_checks import (
    NEW_TOKENS,
    PROMPTS,
    _assert_digests,
    _engine,
    _expected_digests,
    _greedy,
    train_steps,
    trained_source,
)
from lrft.testing.conformance._sync_hooks import WeightSyncHooks
from lrft.testing.reference import greedy_continuation, model_with_weights

Suite = type[WeightSyncHooks[Any]]


def _reference(suite: Suite, source: TrainableModel) -> dict[str, torch.Tensor]:
    parameters = {
        name: tensor.detach().to("cpu", copy=True)
        for name, tensor in suite.source_parameters(source).items()
    }
    return suite.expected_weights(parameters)


def _check_holds(
    suite: Suite, engine: RolloutEngine, source: TrainableModel, what: str
) -> dict[str, torch.Tensor]:
    merged = _reference(suite, source)
    _assert_digests(engine.weights_digest(), _expected_digests(engine, merged), what)
    backdoor = tensor_digests(suite.read_engine_weights(engine))
    _assert_digests(backdoor, _expected_digests(engine, merged), f"{what} (backdoor)")
    return merged


def _sync(
    sync: WeightSync, source: TrainableModel, engine: RolloutEngine, version: int
) -> SyncReport:
    report = sync.sync(source, engine, version=version)
    assert engine.weights_version == version, (
        f"engine at version {engine.weights_version} after a sync to {version}"
    )
    return report


def _expect_complete(report: SyncReport, total: int, what: str) -> None:
    assert (report.unchanged, report.tensors) == (0, total), (
        f"{what}: the sync sent {report.tensors} of {total} weights ({report.unchanged} left in "
        "place), but the engine held no complete copy of what it was sent last: it needs all"
    )


@SYNC_CHECKS
def check_merged_sync_and_changes_only(suite: Suite, model_dir: Path) -> None:
    if not suite.lora:
        pytest.skip("the suite's source model has no LoRA adapters")
    source = trained_source(suite)
    with _engine(suite, model_dir, torch.float32) as engine:
        total = len(engine.parameter_specs())
        sync = suite.make_sync(3 * 1024)
        report = _sync(sync, source, engine, 1)
        _expect_complete(report, total, "the first sync")
        merged = _check_holds(suite, engine, source, "after the first sync, the engine's weights")
        if "sends_changes_only" not in sync.capabilities.names():
            return
        assert isinstance(source, IncrementalWeightSource), (
            f"{type(source).__name__} is not an IncrementalWeightSource"
        )
        varying = source.weights_mark(None).mark.varying
        assert 0 < len(varying) < total, f"a LoRA source names {len(varying)} varying weights"
        train_steps(source, range(2, 3))
        report = _sync(sync, source, engine, 2)
        assert (report.tensors, report.unchanged) == (len(varying), total - len(varying)), (
            f"a sync into an engine holding the last sync's weights sent {report.tensors} "
            f"weights and left {report.unchanged} in place; only the {len(varying)} varying "
            "ones changed"
        )
        merged = _check_holds(suite, engine, source, "after a sync of the changes only")
        model = model_with_weights(model_dir, merged)
        want = [tuple(greedy_continuation(model, prompt, NEW_TOKENS)) for prompt in PROMPTS]
        assert _greedy(engine) == want, "greedy tokens after a sync of the changes only"
        _after_sleep_and_foreign_load(suite, sync, source, engine, merged, total)


def _after_sleep_and_foreign_load(
    suite: Suite,
    sync: WeightSync,
    source: TrainableModel,
    engine: RolloutEngine,
    merged: Mapping[str, torch.Tensor],
    total: int,
) -> None:
    if "sleep_level_1" in engine.capabilities.names():
        engine.sleep(1)
        engine.wake()
        train_steps(source, range(3, 4))
        report = _sync(sync, source, engine, 3)
        assert report.unchanged > 0, "a sleep at level 1 keeps the weights: changes only"
        _check_holds(suite, engine, source, "after a sleep at level 1 and a sync of changes")
    if "sleep_level_2" in engine.capabilities.names():
        engine.sleep(2)
        train_steps(source, range(4, 5))
        report = _sync(sync, source, engine, 4)
        _expect_complete(report, total, "a sync after a sleep at level 2")
        _check_holds(suite, engine, source, "after a sleep at level 2 and a sync")
    # Weights loaded from elsewhere (the older merge, under a new version): all again.
    engine.load_weights(list(merged.items()), version=50)
    report = _sync(sync, source, engine, 5)
    _expect_complete(report, total, "a sync after the engine loaded other weights")
    _check_holds(suite, engine, source, "after another load and a sync")
