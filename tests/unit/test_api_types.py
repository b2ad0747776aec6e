"""Validation of lrft's value types, capability names and combined digests."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lrft.api import (
    CapabilityNotSupported,
    EngineCapabilities,
    EngineState,
    GenerationRequest,
    GenerationResult,
    ModelPart,
    SamplingParams,
    SyncCapabilities,
    TrainCapabilities,
    WeightsResidency,
    combine_digests,
    require,
)

# --- SamplingParams -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n", 0),
        ("temperature", -0.5),
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -1),
        ("max_new_tokens", 0),
        ("min_new_tokens", -1),
        ("stop_token_ids", (2, -1)),
    ],
)
def test_sampling_params_reject_bad_values_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})  # type: ignore[arg-type]  # values are the test's input


def test_min_new_tokens_above_max_new_tokens_names_both() -> None:
    with pytest.raises(ValueError, match=r"min_new_tokens \(9\).*max_new_tokens \(8\)"):
        SamplingParams(min_new_tokens=9, max_new_tokens=8)


def test_sampling_params_normalise_and_describe_greedy() -> None:
    params = SamplingParams(temperature=0.0, stop_token_ids=[7, 8])
    assert params.stop_token_ids == (7, 8)
    assert params.greedy
    assert not SamplingParams(temperature=1e-6).greedy
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        params.n = 2  # type: ignore[misc]  # the assignment frozen must refuse


@given(
    n=st.integers(1, 8),
    temperature=st.floats(0.0, 10.0),
    top_p=st.floats(1e-9, 1.0),
    top_k=st.integers(0, 1000),
    limits=st.tuples(st.integers(0, 64), st.integers(1, 64)).filter(lambda t: t[0] <= t[1]),
)
def test_every_valid_sampling_params_constructs(
    n: int, temperature: float, top_p: float, top_k: int, limits: tuple[int, int]
) -> None:
    params = SamplingParams(
        n=n,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_new_tokens=limits[0],
        max_new_tokens=limits[1],
    )
    assert params.greedy == (temperature == 0.0)


# --- requests and results -----------------------------------------------------------------------


def test_empty_prompt_is_refused_naming_the_request() -> None:
    with pytest.raises(ValueError, match="'q7'"):
        GenerationRequest(prompt_token_ids=(), request_id="q7")
    with pytest.raises(ValueError, match="prompt_token_ids"):
        GenerationRequest(prompt_token_ids=(3, -4))


def _result(output: tuple[int, ...], logprobs: tuple[float, ...] | None) -> GenerationResult:
    return GenerationResult(
        request_id="r",
        sample_index=0,
        prompt_token_ids=(1,),
        output_token_ids=output,
        finish_reason="length",
        logprobs=logprobs,
    )


def test_generation_result_needs_one_logprob_per_output_token() -> None:
    with pytest.raises(ValueError, match="logprobs has 1 entries for 2 output tokens"):
        _result((5, 6), (-0.1,))
    assert _result((5, 6), (-0.1, -0.2)).logprobs == (-0.1, -0.2)
    assert _result((5, 6), None).logprobs is None


# --- capabilities and states --------------------------------------------------------------------


def test_engine_capability_names() -> None:
    caps = EngineCapabilities(sleep_levels=[2, 1], max_tp=4, returns_logprobs=True)
    assert caps.names() == {"sleep_level_1", "sleep_level_2", "tensor_parallel", "returns_logprobs"}
    assert EngineCapabilities().names() == frozenset()
    full = EngineCapabilities(sleep_frees_memory=True, images=True, audio=True, needs_cuda=True)
    assert full.names() == {"sleep_frees_memory", "images", "audio", "needs_cuda"}


def test_engine_capabilities_reject_unknown_levels_and_tp() -> None:
    with pytest.raises(ValueError, match=r"sleep levels must be among \{1, 2\}, got \[1, 3\]"):
        EngineCapabilities(sleep_levels={1, 3})
    with pytest.raises(ValueError, match="max_tp"):
        EngineCapabilities(max_tp=0)


def test_train_and_sync_capability_names() -> None:
    train = TrainCapabilities(offload=[ModelPart.OPTIMIZER, "parameters"], mixed_precision=True)
    assert train.names() == {"offload_optimizer", "offload_parameters", "mixed_precision"}
    long = TrainCapabilities(packed_sequences=True, sequence_parallel=True)
    assert long.names() == {"packed_sequences", "sequence_parallel"}
    assert SyncCapabilities(verifies_digest=True).names() == {"verifies_digest"}


def test_require_names_backend_and_capability() -> None:
    caps = EngineCapabilities(sleep_levels={1})
    require("hf", caps, "sleep_level_1")
    with pytest.raises(CapabilityNotSupported, match="hf does not support sleep_level_2") as raised:
        require("hf", caps, "sleep_level_2")
    assert (raised.value.backend, raised.value.capability) == ("hf", "sleep_level_2")


def test_engine_state_levels_and_properties() -> None:
    awake = EngineState(
        weights=WeightsResidency.RESIDENT, kv_cache_resident=True, weights_version=3, sleep_level=0
    )
    assert awake.awake
    assert not awake.stale
    stale = attrs.evolve(awake, weights_version=None)
    assert stale.stale
    with pytest.raises(ValueError, match="sleep_level"):
        attrs.evolve(awake, sleep_level=3)


# --- combine_digests ------------------------------------------------------------------------------


def test_combined_digest_ignores_order_but_not_content() -> None:
    first = {"a": "x", "b": "y"}
    assert combine_digests(first) == combine_digests({"b": "y", "a": "x"})
    assert combine_digests(first) != combine_digests({"a": "y", "b": "x"})
