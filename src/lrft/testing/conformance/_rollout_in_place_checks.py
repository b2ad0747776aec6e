"""Rank-side checks of ``RolloutEngineSuite`` for engines that load in place (the
``loads_in_place`` capability): what ``InPlaceWeightLoader`` lends is the storage the engine
serves from, lending counts as loading, and its digest sums are the engine's digest."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from lrft.api import EnginePart, InPlaceWeightLoader, WeightLoader, WeightLoadError
from lrft.api.digest import format_digests
from lrft.testing.conformance._rollout_asserts import (
    assert_digests_equal,
    assert_matches_reference,
    greedy_outputs,
)
from lrft.testing.conformance._rollout_common import (
    EngineModels,
    backdoor_digests,
    model_weights,
    rank_prompts,
    ready_engine,
    reference_digests,
    require_capability,
    rollout_check,
    version_of,
)
from lrft.testing.conformance.expect import raises

if TYPE_CHECKING:
    from lrft.testing.conformance._rollout_common import Suite


@rollout_check
def check_in_place_capability_matches_loader(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = ready_engine(suite, models, device)
    declared = "loads_in_place" in engine.capabilities.names()
    with engine.weight_update(2) as load:
        lends = isinstance(load, InPlaceWeightLoader)
        load(list(model_weights(models.base_dir).items()))
    assert lends == declared, (
        f"{engine.name} engine declares loads_in_place={declared} but its weight_update yields "
        f"{'an' if lends else 'no'} InPlaceWeightLoader"
    )


@rollout_check
def check_in_place_load_serves_what_was_written(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = ready_engine(suite, models, device)
    require_capability(engine, "loads_in_place")
    prompts = rank_prompts(rank)
    specs = engine.parameter_specs()
    other = model_weights(models.other_dir)
    names = sorted(specs)
    half = len(names) // 2
    with engine.weight_update(4) as load:
        lender = _lender(load)
        order = list(lender.digest_order())
        assert sorted(order) == names, (
            f"digest_order() is not every weight once: {sorted(set(order) ^ set(names))}"
        )
        for part in (names[:half], names[half:]):
            targets = _lend(load, part)
            for name, target in zip(part, targets, strict=True):
                spec = specs[name]
                assert (tuple(target.shape), target.dtype) == (spec.shape, spec.dtype), (
                    f"target {name!r} is {tuple(target.shape)} {target.dtype}, the engine "
                    f"stores {spec.shape} {spec.dtype}"
                )
                assert target.is_contiguous(), f"target {name!r} is not contiguous"
                assert target.device == device, (
                    f"target {name!r} is on {target.device}, the engine's device is {device}"
                )
                target.copy_(other[name])
        sums = lender.digest_sums()
    assert version_of(engine) == 4, f"after writing every weight in place: {engine.state}"
    expected = reference_digests(models.other_dir, engine)
    assert_digests_equal(
        engine.weights_digest(), expected, "weights_digest() after writing in place"
    )
    assert_digests_equal(
        backdoor_digests(suite, engine), expected, "the backdoor after writing in place"
    )
    assert_digests_equal(
        format_digests(order, [specs[n] for n in order], sums),
        expected,
        "digest_sums() after writing in place",
    )
    assert_matches_reference(
        greedy_outputs(engine, prompts), prompts, models.other_dir, device, "in-place update"
    )


@rollout_check
def check_lending_counts_as_loading(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = ready_engine(suite, models, device)
    require_capability(engine, "loads_in_place")
    require_capability(engine, "sleep_level_2")
    prompts = rank_prompts(rank)
    base = model_weights(models.base_dir)
    engine.sleep(2)
    engine.wake([EnginePart.WEIGHTS])
    names = sorted(engine.parameter_specs())
    with engine.weight_update(5) as load:
        for name, target in zip(names[1:], _lend(load, names[1:]), strict=True):
            target.copy_(base[name])
    assert engine.weights_version is None, (
        "released weights written in place except one were labelled a complete version"
    )
    with engine.weight_update(6) as load:
        for name, target in zip(names, _lend(load, names), strict=True):
            target.copy_(base[name])
    assert version_of(engine) == 6, f"every weight was written in place: {engine.state}"
    engine.wake()
    assert_matches_reference(
        greedy_outputs(engine, prompts), prompts, models.base_dir, device, "in place after sleep 2"
    )


@rollout_check
def check_in_place_loader_refuses_misuse(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = ready_engine(suite, models, device)
    require_capability(engine, "loads_in_place")
    before = engine.weights_digest()
    unknown = "model.layers.0.mlp.no_such_weight"
    known = sorted(engine.parameter_specs())[0]
    doing = f"targets([{known!r}, {unknown!r}])"
    with (
        raises(WeightLoadError, doing, match=unknown.replace(".", r"\.")),
        engine.weight_update(7) as load,
    ):
        _lend(load, [known, unknown])
    assert engine.weights_version is None, f"a refused lend left the engine fresh: {engine.state}"
    assert_digests_equal(engine.weights_digest(), before, "weights_digest() after a refused lend")
    engine.load_weights(list(model_weights(models.base_dir).items()), version=8)
    with engine.weight_update(9) as load:
        lender = _lender(load)
        load(list(model_weights(models.base_dir).items()))
    uses = {
        f"targets([{known!r}])": lambda: lender.targets([known]),
        "digest_sums()": lender.digest_sums,
        "digest_order()": lender.digest_order,
    }
    for what, use in uses.items():
        with raises(RuntimeError, f"the loader's {what} after its block exited", match="exited"):
            use()
    assert version_of(engine) == 9, f"a use after the block changed the engine: {engine.state}"


def _lender(load: WeightLoader) -> InPlaceWeightLoader:
    assert isinstance(load, InPlaceWeightLoader), (
        f"the engine declares loads_in_place, but weight_update yields a {type(load).__name__}, "
        "not an InPlaceWeightLoader"
    )
    return load


def _lend(load: WeightLoader, names: list[str]) -> list[torch.Tensor]:
    return _lender(load).targets(names)
