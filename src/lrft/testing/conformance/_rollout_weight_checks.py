"""Rank-side checks of ``RolloutEngineSuite`` on memory states: sleep levels, wake order,
staleness, refused levels, the digest and shutdown, each against the reference decode or the
backdoor read of the engine's weights. Loading is checked in ``_rollout_load_checks``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import torch

from lrft.api import (
    CapabilityNotSupported,
    EngineAsleepError,
    EnginePart,
    RolloutEngine,
    SamplingParams,
    StaleWeightsError,
    WeightsResidency,
)
from lrft.testing.conformance._rollout_asserts import (
    assert_digests_equal,
    assert_matches_reference,
    generate_checked,
    greedy_outputs,
)
from lrft.testing.conformance._rollout_common import (
    BASE_VERSION,
    EngineModels,
    backdoor_digests,
    model_weights,
    rank_prompts,
    ready_engine,
    reference_digests,
    requests_for,
    require_capability,
    rollout_check,
    take_engine,
    version_of,
)
from lrft.testing.conformance.expect import raises

if TYPE_CHECKING:
    from lrft.testing.conformance._rollout_common import Suite


def _declared_levels(engine: RolloutEngine) -> list[int]:
    levels = sorted(engine.capabilities.sleep_levels)
    if not levels:
        pytest.skip(f"{engine.name} engine lacks capability sleep_level_1 and sleep_level_2")
    return levels


def generate_raises(
    engine: RolloutEngine, prompts: tuple[tuple[int, ...], ...], expected: type[Exception]
) -> None:
    """``generate`` must raise ``expected`` (``EngineAsleepError`` or ``StaleWeightsError``)."""
    state = engine.state
    with raises((EngineAsleepError, StaleWeightsError), f"generate() in state {state}") as raised:
        greedy_outputs(engine, prompts[:1])
    assert type(raised.value) is expected, (
        f"generate() in state {state} raised {type(raised.value).__name__}, not "
        f"{expected.__name__}: {raised.value}"
    )


@rollout_check
def check_asleep_refuses_work(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    prompts = rank_prompts(rank)
    for level in _declared_levels(ready_engine(suite, models, device)):
        engine = ready_engine(suite, models, device)
        engine.sleep(level)
        state = engine.state
        assert (state.sleep_level, state.kv_cache_resident) == (level, False), (
            f"after sleep({level}): {state}"
        )
        generate_raises(engine, prompts, EngineAsleepError)
        if state.weights is not WeightsResidency.RESIDENT:
            with raises(EngineAsleepError, f"weights_digest() in state {state}"):
                engine.weights_digest()
            other = list(model_weights(models.other_dir).items())
            with raises(EngineAsleepError, f"load_weights() in state {state}"):
                engine.load_weights(other, version=9)
            assert engine.state == state, f"a refused load changed the state to {engine.state}"


@rollout_check
def check_level_1_restores_outputs(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = ready_engine(suite, models, device)
    require_capability(engine, "sleep_level_1")
    prompts = rank_prompts(rank)
    logprobs = "returns_logprobs" in engine.capabilities.names()
    params = SamplingParams(temperature=0.0, max_new_tokens=8, return_logprobs=logprobs)
    requests = requests_for(prompts)
    before = generate_checked(engine, requests, params)
    digest = engine.weights_digest()
    engine.sleep(1)
    engine.sleep(1)  # sleeping again at the same level keeps it
    state = engine.state
    assert state.weights in (WeightsResidency.RESIDENT, WeightsResidency.PARKED), (
        f"sleep(1) must keep the weights resident or park them: {state}"
    )
    assert (state.sleep_level, state.kv_cache_resident, state.weights_version) == (
        1, False, BASE_VERSION,
    ), f"after sleep(1): {state}"  # fmt: skip
    engine.wake()
    engine.wake()  # waking while awake does nothing
    assert (engine.state.awake, engine.weights_version) == (True, BASE_VERSION), (
        f"after sleep(1), wake(), wake(): {engine.state}"
    )
    assert_digests_equal(
        engine.weights_digest(), digest, "weights_digest() after waking from level 1"
    )
    after = generate_checked(engine, requests, params)
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    assert not changed, (
        f"outputs changed across sleep(1)/wake(), e.g. result {changed[0]}: {before[changed[0]]} "
        f"before, {after[changed[0]]} after"
    )


@rollout_check
def check_level_2_stale_until_loaded(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """Level 2, entered by deepening level 1 (when declared) and by ``sleep(2)`` from awake:
    the weights are released and the engine stale; waking leaves it stale (a partial load
    too) until a complete load, after which it serves the loaded weights."""
    engine = ready_engine(suite, models, device)
    require_capability(engine, "sleep_level_2")
    routes = ["from awake"]
    if 1 in engine.capabilities.sleep_levels:
        routes.insert(0, "deepening level 1")
    for version, route in enumerate(routes):
        _through_level_2(suite, models, engine, rank, device, route, version=10 * version)


def _through_level_2(
    suite: Suite,
    models: EngineModels,
    engine: RolloutEngine,
    rank: int,
    device: torch.device,
    route: str,
    *,
    version: int,
) -> None:
    prompts = rank_prompts(rank)
    if route == "deepening level 1":
        engine.sleep(1)
        engine.sleep(2)
        engine.sleep(1)  # keeps level 2
    else:
        engine.sleep(2)
    state = engine.state
    assert (state.weights, state.sleep_level, state.weights_version) == (
        WeightsResidency.RELEASED, 2, None,
    ), f"after sleep(2) {route}: {state}, not weights released at level 2 and stale"  # fmt: skip
    generate_raises(engine, prompts, EngineAsleepError)
    engine.wake()
    awake = engine.state
    assert (awake.weights, awake.kv_cache_resident) == (WeightsResidency.RESIDENT, True), (
        f"after sleep(2) {route} and wake(): {awake}"
    )
    assert engine.weights_version is None, (
        f"fresh after waking from level 2 (entered {route}): {engine.state}"
    )
    generate_raises(engine, prompts, StaleWeightsError)
    weights = list(model_weights(models.base_dir).items())
    engine.load_weights(weights[:-1], version=version + 7)
    assert engine.weights_version is None, (
        f"fresh after a load that left {weights[-1][0]!r} undefined (level 2 entered {route}): "
        f"{engine.state}"
    )
    generate_raises(engine, prompts, StaleWeightsError)
    engine.load_weights(weights, version=version + 8)
    assert version_of(engine) == version + 8, (
        f"a complete load did not make it fresh (level 2 entered {route}): {engine.state}"
    )
    assert_digests_equal(
        backdoor_digests(suite, engine),
        reference_digests(models.base_dir, engine),
        f"the backdoor after reloading the weights released at level 2 (entered {route})",
    )
    got = greedy_outputs(engine, prompts)
    assert_matches_reference(
        got, prompts, models.base_dir, device, f"reloaded after level 2 (entered {route})"
    )


@rollout_check
def check_kv_cache_waits_for_weights(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    prompts = rank_prompts(rank)
    for level in _declared_levels(ready_engine(suite, models, device)):
        engine = ready_engine(suite, models, device)
        engine.sleep(level)
        asleep = engine.state
        if asleep.weights is not WeightsResidency.RESIDENT:
            with raises(EngineAsleepError, f"wake([KV_CACHE]) in state {asleep}"):
                engine.wake([EnginePart.KV_CACHE])
            assert engine.state == asleep, f"a refused wake changed the state to {engine.state}"
            engine.wake([EnginePart.WEIGHTS])
            state = engine.state
            assert (state.weights, state.kv_cache_resident) == (WeightsResidency.RESIDENT, False), (
                f"wake([WEIGHTS]) after sleep({level}) must wake the weights only: {state}"
            )
            generate_raises(engine, prompts, EngineAsleepError)
        engine.wake([EnginePart.KV_CACHE])
        assert engine.state.kv_cache_resident, (
            f"wake([KV_CACHE]) after sleep({level}) left {engine.state}"
        )
        if level == 1:
            assert engine.weights_version == BASE_VERSION, (
                f"waking from level 1 part by part lost the version: {engine.state}"
            )
            got = greedy_outputs(engine, prompts)
            assert_matches_reference(got, prompts, models.base_dir, device, "woken part by part")


@rollout_check
def check_unsupported_level(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = ready_engine(suite, models, device)
    undeclared = sorted({1, 2} - engine.capabilities.sleep_levels)
    if not undeclared:
        pytest.skip(
            f"{engine.name} engine declares sleep_level_1 and sleep_level_2: no lrft sleep level "
            "is unsupported"
        )
    _assert_level_refused(suite, engine, undeclared)


@rollout_check
def check_level_outside_lrft(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    _assert_level_refused(suite, ready_engine(suite, models, device), [3])


def _assert_level_refused(suite: Suite, engine: RolloutEngine, levels: list[int]) -> None:
    before = (engine.state, backdoor_digests(suite, engine))
    for level in levels:
        with raises(CapabilityNotSupported, f"sleep({level})") as raised:
            engine.sleep(level)
        assert (raised.value.backend, raised.value.capability) == (
            engine.name, f"sleep_level_{level}",
        ), f"sleep({level}) raised {raised.value!r}"  # fmt: skip
        assert engine.state == before[0], (
            f"a refused sleep({level}) changed the state {before[0]} to {engine.state}"
        )
        assert_digests_equal(
            backdoor_digests(suite, engine),
            before[1],
            f"the weights after a refused sleep({level})",
        )


@rollout_check
def check_digest_matches_backdoor(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = ready_engine(suite, models, device)
    digest = engine.weights_digest()
    assert set(digest) == set(engine.parameter_specs()), (
        f"weights_digest() names differ from parameter_specs(): "
        f"{sorted(set(digest) ^ set(engine.parameter_specs()))}"
    )
    assert_digests_equal(
        digest, backdoor_digests(suite, engine), "weights_digest() against the backdoor's weights"
    )
    assert_digests_equal(
        digest, reference_digests(models.base_dir, engine), "weights_digest() of the base weights"
    )


@rollout_check
def check_shutdown(suite: Suite, models: EngineModels, rank: int, device: torch.device) -> None:
    engine = take_engine(suite, models, device)
    with engine as entered:
        assert entered is engine, f"__enter__ returned {entered!r}, not the engine"
    # the contract says only "unusable": any exception will do
    with raises(Exception, "generate() after the engine was shut down (leaving its with block)"):
        greedy_outputs(engine, rank_prompts(rank)[:1])
    engine.shutdown()  # idempotent
