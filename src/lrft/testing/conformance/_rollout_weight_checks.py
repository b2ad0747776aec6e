"""Rank-side checks of ``RolloutEngineSuite`` on memory states and weights: sleep levels, wake
order, staleness, loading, validation, digests and shutdown, each against the reference decode or
the backdoor read of the engine's weights."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import torch

from lrft.api import (
    CapabilityNotSupported,
    EngineAsleepError,
    EnginePart,
    NamedTensors,
    RolloutEngine,
    SamplingParams,
    StaleWeightsError,
    WeightLoadError,
    WeightsResidency,
)
from lrft.testing.conformance._rollout_common import (
    BASE_VERSION,
    EngineModels,
    assert_matches_reference,
    backdoor_digests,
    first_differing_tensor,
    greedy_outputs,
    model_weights,
    rank_check,
    rank_prompts,
    ready_engine,
    reference_digests,
    requests_for,
    require_capability,
    take_engine,
    version_of,
)

if TYPE_CHECKING:
    from lrft.testing.conformance._rollout_common import Suite


def _declared_levels(engine: RolloutEngine) -> list[int]:
    levels = sorted(engine.capabilities.sleep_levels)
    if not levels:
        pytest.skip(f"{engine.name} engine lacks capability sleep_level_1 and sleep_level_2")
    return levels


def _generate_raises(engine: RolloutEngine, prompts: tuple[tuple[int, ...], ...]) -> type:
    with pytest.raises((EngineAsleepError, StaleWeightsError)) as raised:
        greedy_outputs(engine, prompts[:1])
    return raised.type


@rank_check
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
        raised = _generate_raises(engine, prompts)
        assert raised is EngineAsleepError, f"generate after sleep({level}) raised {raised}"
        if state.weights is not WeightsResidency.RESIDENT:
            with pytest.raises(EngineAsleepError):
                engine.weights_digest()
            with pytest.raises(EngineAsleepError):
                engine.load_weights(list(model_weights(models.other_dir).items()), version=9)
            assert engine.state == state, f"a refused load changed the state: {engine.state}"


@rank_check
def check_level_1_restores_outputs(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = ready_engine(suite, models, device)
    require_capability(engine, "sleep_level_1")
    prompts = rank_prompts(rank)
    logprobs = "returns_logprobs" in engine.capabilities.names()
    params = SamplingParams(temperature=0.0, max_new_tokens=8, return_logprobs=logprobs)
    requests = requests_for(prompts)
    before = engine.generate(requests, params)
    digest = engine.weights_digest()
    engine.sleep(1)
    engine.sleep(1)  # sleeping again at the same level keeps it
    state = engine.state
    assert state.weights in (WeightsResidency.RESIDENT, WeightsResidency.PARKED), state
    assert (state.sleep_level, state.kv_cache_resident, state.weights_version) == (
        1, False, BASE_VERSION,
    ), f"after sleep(1): {state}"  # fmt: skip
    engine.wake()
    engine.wake()  # waking while awake does nothing
    assert (engine.state.awake, engine.weights_version) == (True, BASE_VERSION), engine.state
    assert engine.weights_digest() == digest, "waking from level 1 did not restore the weights"
    assert engine.generate(requests, params) == before, "outputs changed across sleep(1)/wake()"


@rank_check
def check_level_2_stale_until_loaded(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = ready_engine(suite, models, device)
    require_capability(engine, "sleep_level_2")
    prompts = rank_prompts(rank)
    has_level_1 = 1 in engine.capabilities.sleep_levels
    if has_level_1:
        engine.sleep(1)
    engine.sleep(2)  # deepens level 1
    if has_level_1:
        engine.sleep(1)  # keeps level 2
    state = engine.state
    assert (state.weights, state.sleep_level, state.weights_version) == (
        WeightsResidency.RELEASED, 2, None,
    ), f"after sleep(2): {state}"  # fmt: skip
    assert _generate_raises(engine, prompts) is EngineAsleepError
    engine.wake()
    awake = engine.state
    assert (awake.weights, awake.kv_cache_resident) == (WeightsResidency.RESIDENT, True), awake
    assert engine.weights_version is None, f"fresh after waking from level 2: {engine.state}"
    assert _generate_raises(engine, prompts) is StaleWeightsError
    weights = list(model_weights(models.base_dir).items())
    engine.load_weights(weights[:-1], version=7)
    assert engine.weights_version is None, (
        f"fresh after a load that left {weights[-1][0]!r} undefined: {engine.state}"
    )
    assert _generate_raises(engine, prompts) is StaleWeightsError
    engine.load_weights(weights, version=8)
    assert version_of(engine) == 8, f"a complete load did not make it fresh: {engine.state}"
    assert backdoor_digests(suite, engine) == reference_digests(models.base_dir, engine)
    got = greedy_outputs(engine, prompts)
    assert_matches_reference(got, prompts, models.base_dir, device, "reloaded after level 2")


@rank_check
def check_kv_cache_waits_for_weights(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    prompts = rank_prompts(rank)
    for level in _declared_levels(ready_engine(suite, models, device)):
        engine = ready_engine(suite, models, device)
        engine.sleep(level)
        asleep = engine.state
        if asleep.weights is not WeightsResidency.RESIDENT:
            with pytest.raises(EngineAsleepError):
                engine.wake([EnginePart.KV_CACHE])
            assert engine.state == asleep, f"a refused wake changed the state: {engine.state}"
            engine.wake([EnginePart.WEIGHTS])
            state = engine.state
            assert (state.weights, state.kv_cache_resident) == (WeightsResidency.RESIDENT, False), (
                f"wake([WEIGHTS]) after sleep({level}) must wake the weights only: {state}"
            )
            assert _generate_raises(engine, prompts) is EngineAsleepError
        engine.wake([EnginePart.KV_CACHE])
        assert engine.state.kv_cache_resident, engine.state
        if level == 1:
            assert engine.weights_version == BASE_VERSION
            got = greedy_outputs(engine, prompts)
            assert_matches_reference(got, prompts, models.base_dir, device, "woken part by part")


@rank_check
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


@rank_check
def check_level_outside_lrft(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    _assert_level_refused(suite, ready_engine(suite, models, device), [3])


def _assert_level_refused(suite: Suite, engine: RolloutEngine, levels: list[int]) -> None:
    before = (engine.state, backdoor_digests(suite, engine))
    for level in levels:
        with pytest.raises(CapabilityNotSupported) as raised:
            engine.sleep(level)
        assert (raised.value.backend, raised.value.capability) == (
            engine.name, f"sleep_level_{level}",
        ), f"sleep({level}) raised {raised.value!r}"  # fmt: skip
        assert (engine.state, backdoor_digests(suite, engine)) == before, (
            f"a refused sleep({level}) changed the engine: {engine.state}"
        )


@rank_check
def check_load_other_weights(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = ready_engine(suite, models, device)
    prompts = rank_prompts(rank)
    base_outputs = greedy_outputs(engine, prompts)
    other = model_weights(models.other_dir)
    base = model_weights(models.base_dir)
    alike = sorted(name for name in other if torch.equal(other[name], base[name]))
    assert not alike, f"the test models share {alike}: skipping them in a load would go unseen"
    engine.load_weights(list(other.items()), version=2)
    assert engine.weights_version == 2, f"after load_weights(version=2): {engine.state}"
    wrong = first_differing_tensor(suite.read_engine_weights(engine), other)
    assert wrong is None, f"after load_weights, the engine's {wrong!r} is not the loaded tensor"
    assert engine.weights_digest() == reference_digests(models.other_dir, engine)
    got = greedy_outputs(engine, prompts)
    assert got != base_outputs, "the two test models decode alike: the check would prove nothing"
    assert_matches_reference(got, prompts, models.other_dir, device, "after loading other weights")
    engine.load_weights(list(model_weights(models.base_dir).items()), version=3)
    got = greedy_outputs(engine, prompts)
    assert_matches_reference(got, prompts, models.base_dir, device, "after loading back")


@rank_check
def check_bad_batch_changes_nothing(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = ready_engine(suite, models, device)
    prompts = rank_prompts(rank)
    other = list(model_weights(models.other_dir).items())
    name, tensor = other[1]
    unknown = "model.layers.0.mlp.no_such_weight"
    bad_batches = {
        unknown: [*other[:3], (unknown, tensor), *other[3:]],
        name: [other[0], (name, tensor.reshape(-1)[:-1]), *other[2:]],
    }
    before = (engine.state, engine.weights_digest(), backdoor_digests(suite, engine))
    for culprit, batch in bad_batches.items():
        with pytest.raises(WeightLoadError, match=culprit.replace(".", r"\.")):
            engine.load_weights(batch, version=5)
        after = (engine.state, engine.weights_digest(), backdoor_digests(suite, engine))
        assert after == before, f"a load_weights refused for {culprit!r} changed the engine"
        with (
            pytest.raises(WeightLoadError, match=culprit.replace(".", r"\.")),
            engine.weight_update(6) as load,
        ):
            load(batch)
        assert engine.weights_version is None, "a failed weight_update left the engine fresh"
        held = (engine.weights_digest(), backdoor_digests(suite, engine))
        assert held == before[1:], f"a weight_update refused for {culprit!r} changed weights"
        engine.load_weights(list(model_weights(models.base_dir).items()), version=BASE_VERSION)
    got = greedy_outputs(engine, prompts)
    assert_matches_reference(got, prompts, models.base_dir, device, "after refused batches")


@rank_check
def check_weight_update_stream(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = ready_engine(suite, models, device)
    prompts = rank_prompts(rank)
    other = list(model_weights(models.other_dir).items())
    half = len(other) // 2
    with engine.weight_update(4) as load:
        assert engine.weights_version is None, "an open update must make the engine stale"
        assert _generate_raises(engine, prompts) is StaleWeightsError
        load(other[:half])
        load(other[half:])
    assert version_of(engine) == 4, f"after a clean streaming update: {engine.state}"
    assert_matches_reference(
        greedy_outputs(engine, prompts), prompts, models.other_dir, device, "streamed update"
    )
    digest = engine.weights_digest()
    with pytest.raises(RuntimeError, match="before copying"), engine.weight_update(5):
        raise RuntimeError("failed before copying")
    assert engine.weights_version is None, f"fresh after a failed update: {engine.state}"
    assert engine.weights_digest() == digest, "an update that copied nothing changed weights"
    base = list(model_weights(models.base_dir).items())
    with pytest.raises(RuntimeError, match="after copying"):
        _fail_after_copying(engine, base[:half], version=6)
    assert version_of(engine) is None, f"fresh after a failed partial update: {engine.state}"
    assert _generate_raises(engine, prompts) is StaleWeightsError
    engine.load_weights(base[half:], version=7)
    assert engine.weights_version is None, (
        f"a partial update after a failed one left a mix of versions labelled fresh: {engine.state}"
    )
    engine.load_weights(base, version=8)
    assert version_of(engine) == 8, engine.state
    assert_matches_reference(
        greedy_outputs(engine, prompts), prompts, models.base_dir, device, "recovered update"
    )


def _fail_after_copying(engine: RolloutEngine, batch: NamedTensors, *, version: int) -> None:
    with engine.weight_update(version) as load:
        load(batch)
        raise RuntimeError("failed after copying")


@rank_check
def check_digest_matches_backdoor(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = ready_engine(suite, models, device)
    digest = engine.weights_digest()
    assert set(digest) == set(engine.parameter_specs()), (
        f"weights_digest() names differ from parameter_specs(): "
        f"{sorted(set(digest) ^ set(engine.parameter_specs()))}"
    )
    backdoor = backdoor_digests(suite, engine)
    wrong = sorted(name for name in backdoor if digest.get(name) != backdoor[name])
    assert not wrong, (
        f"weights_digest() disagrees with the weights read through the backdoor for {wrong}"
    )
    assert digest == reference_digests(models.base_dir, engine), (
        "weights_digest() is not the digest of the loaded weights"
    )


@rank_check
def check_shutdown(suite: Suite, models: EngineModels, rank: int, device: torch.device) -> None:
    engine = take_engine(suite, models, device)
    with engine as entered:
        assert entered is engine, "__enter__ must return the engine"
    with pytest.raises(Exception):  # noqa: B017, PT011  # the contract says only "unusable"
        greedy_outputs(engine, rank_prompts(rank)[:1])
    engine.shutdown()  # idempotent
