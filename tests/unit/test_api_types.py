"""Validation of lrft's value types, capability names and the tensor digest."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import torch
from hypothesis import assume, given
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
    tensor_digest,
)
from lrft.api import digest as digest_module
from lrft.api.digest import PendingDigests, tensor_digests

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
    full = EngineCapabilities(sleep_frees_memory=True, multimodal=True, needs_cuda=True)
    assert full.names() == {"sleep_frees_memory", "multimodal", "needs_cuda"}


def test_engine_capabilities_reject_unknown_levels_and_tp() -> None:
    with pytest.raises(ValueError, match=r"sleep levels must be among \{1, 2\}, got \[1, 3\]"):
        EngineCapabilities(sleep_levels={1, 3})
    with pytest.raises(ValueError, match="max_tp"):
        EngineCapabilities(max_tp=0)


def test_train_and_sync_capability_names() -> None:
    train = TrainCapabilities(offload=[ModelPart.OPTIMIZER, "parameters"], mixed_precision=True)
    assert train.names() == {"offload_optimizer", "offload_parameters", "mixed_precision"}
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


# --- tensor_digest ------------------------------------------------------------------------------

words = st.lists(st.integers(-(2**31), 2**31 - 1), min_size=2, max_size=300)


@given(values=words)
def test_equal_tensors_have_equal_digests(values: list[int]) -> None:
    tensor = torch.tensor(values, dtype=torch.int32)
    assert tensor_digest(tensor) == tensor_digest(tensor.clone())
    # a non-contiguous view with the same values digests like its contiguous copy
    strided = torch.stack([tensor, tensor], dim=1)[:, 0]
    assert tensor_digest(strided) == tensor_digest(tensor)


@given(values=words, data=st.data())
def test_one_changed_element_changes_the_digest(values: list[int], data: st.DataObject) -> None:
    tensor = torch.tensor(values, dtype=torch.int32)
    position = data.draw(st.integers(0, len(values) - 1))
    new = data.draw(st.integers(-(2**31), 2**31 - 1).filter(lambda x: x != values[position]))
    changed = tensor.clone()
    changed[position] = new
    assert tensor_digest(changed) != tensor_digest(tensor)


@given(values=words, data=st.data())
def test_swapped_elements_change_the_digest(values: list[int], data: st.DataObject) -> None:
    assume(len(set(values)) > 1)
    i = data.draw(st.integers(0, len(values) - 1))
    j = data.draw(st.integers(0, len(values) - 1).filter(lambda j: values[j] != values[i]))
    tensor = torch.tensor(values, dtype=torch.int32)
    swapped = tensor.clone()
    swapped[i], swapped[j] = tensor[j], tensor[i]
    assert tensor_digest(swapped) != tensor_digest(tensor)


def test_dtype_and_shape_are_part_of_the_digest() -> None:
    floats = torch.arange(12, dtype=torch.float32)
    same_bytes = floats.view(torch.int32)
    assert tensor_digest(same_bytes) != tensor_digest(floats)
    assert tensor_digest(floats.reshape(3, 4)) != tensor_digest(floats.reshape(4, 3))
    assert tensor_digest(floats.to(torch.bfloat16)) != tensor_digest(floats)
    # byte counts that are not a multiple of 4 are padded, not confused with a longer tensor
    assert tensor_digest(torch.tensor([1, 2, 3], dtype=torch.uint8)) != tensor_digest(
        torch.tensor([1, 2, 3, 0], dtype=torch.uint8)
    )


def _reference_digest(tensor: torch.Tensor, period: int) -> str:
    """The fingerprint's definition, evaluated with numpy's wrapping uint64 arithmetic: the sum
    of the 32-bit words and the sum of ``word * (2 * (position % period) + 1)``."""
    raw = tensor.contiguous().reshape(-1).view(torch.uint8).numpy()
    raw = np.concatenate([raw, np.zeros((-raw.size) % 4, dtype=np.uint8)])
    words = raw.view(np.int32).astype(np.int64).astype(np.uint64)
    weights = (np.arange(words.size, dtype=np.uint64) % np.uint64(period)) * np.uint64(
        2
    ) + np.uint64(1)
    plain = int(words.sum(dtype=np.uint64))
    weighted = int((words * weights).sum(dtype=np.uint64))
    shape = "x".join(str(d) for d in tensor.shape)
    dtype = str(tensor.dtype).removeprefix("torch.")
    return f"{dtype}[{shape}]:{plain:016x}{weighted:016x}"


@pytest.mark.parametrize("period", [4, 7, 1 << 20])
@pytest.mark.parametrize("size", [0, 3, 7, 8, 29, 5003])
def test_digest_equals_its_definition(
    period: int, size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Column sums over the weight period, remainders and 32-bit halves included, give the
    definition's value (a small period exercises every path on small tensors)."""
    monkeypatch.setattr(digest_module, "_WEIGHT_PERIOD", period)
    monkeypatch.setattr(digest_module, "_WEIGHTS", {})
    generator = torch.Generator().manual_seed(size)
    for tensor in (
        torch.randn(size, generator=generator),
        torch.randint(-(2**31), 2**31 - 1, (size,), generator=generator, dtype=torch.int64).to(
            torch.int32
        ),
        torch.full((size,), 2**31 - 1, dtype=torch.int32),
        torch.randn(size, generator=generator).to(torch.bfloat16),
    ):
        assert tensor_digest(tensor) == _reference_digest(tensor, period)


def test_digest_of_a_large_tensor_equals_its_definition() -> None:
    tensor = torch.randn(3 * (1 << 20) + 17, generator=torch.Generator().manual_seed(0))
    assert tensor_digest(tensor) == _reference_digest(tensor, 1 << 20)


def test_pending_digests_resolve_to_the_per_tensor_digests() -> None:
    generator = torch.Generator().manual_seed(1)
    named = {f"t{i}": torch.randn(i * 37 + 1, generator=generator) for i in range(5)}
    pending = PendingDigests()
    for name, tensor in named.items():
        pending.add(name, tensor)
        tensor.zero_()  # only the sums are kept: the tensor may be reused at once
    assert len(pending) == 5
    generator = torch.Generator().manual_seed(1)
    expected = {
        f"t{i}": tensor_digest(torch.randn(i * 37 + 1, generator=generator)) for i in range(5)
    }
    assert pending.resolve() == expected
    zeroed = tensor_digests(named)
    assert zeroed == {name: tensor_digest(tensor) for name, tensor in named.items()}
    assert zeroed != expected


def test_combined_digest_ignores_order_but_not_content() -> None:
    first = {"a": "x", "b": "y"}
    assert combine_digests(first) == combine_digests({"b": "y", "a": "x"})
    assert combine_digests(first) != combine_digests({"a": "y", "b": "x"})
