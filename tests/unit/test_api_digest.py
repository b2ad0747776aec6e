"""The tensor digest's plain implementation against its definition, evaluated in plain Python
integers, and what the fingerprint detects."""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from lrft.api import digest as digest_module
from lrft.api import tensor_digest
from lrft.api.digest import digest_sums, format_digest, format_digests, tensor_digests
from tests.unit.digest_cases import (
    ROW_WORDS,
    case_digests,
    case_sums,
    cases,
)


@pytest.fixture(scope="module")
def reference() -> dict[str, tuple[int, int]]:
    return case_sums()


@pytest.fixture(scope="module")
def expected() -> dict[str, str]:
    return case_digests()


def test_the_cases_wrap_around_and_are_laid_out_as_named(
    reference: dict[str, tuple[int, int]],
) -> None:
    tensors = cases()
    assert not tensors["transposed"].is_contiguous()
    assert not tensors["strided"].is_contiguous()
    assert tensors["one_row"].numel() == ROW_WORDS
    assert max(reference["large_positive"]) >= 2**63
    assert min(reference["large_signed"]) < -(2**63)


def test_each_digest_equals_its_definition(expected: dict[str, str]) -> None:
    for name, tensor in cases().items():
        assert tensor_digest(tensor) == expected[name], name


def test_batched_digests_equal_the_definition(expected: dict[str, str]) -> None:
    assert tensor_digests(cases()) == expected


def test_sums_summed_in_chunks_equal_the_definition(
    monkeypatch: pytest.MonkeyPatch, reference: dict[str, tuple[int, int]]
) -> None:
    # Chunks of 7 words: a chunk boundary inside the last, zero-padded word of some tensors
    # and far from the start of others, so each chunk's weights must continue the last one's.
    monkeypatch.setattr(digest_module, "_CHUNK_WORDS", 7)
    tensors = cases()
    sums = digest_sums(list(tensors.values())).tolist()
    for name, got in zip(tensors, sums, strict=True):
        assert [s % 2**64 for s in got] == [s % 2**64 for s in reference[name]], name


def test_tensors_on_two_devices_are_refused_naming_both() -> None:
    with pytest.raises(ValueError, match="tensor 0 is on cpu, tensor 1 on meta"):
        digest_sums([torch.ones(3), torch.ones(3, device="meta")])


def test_no_tensors_give_no_sums() -> None:
    assert digest_sums([]).shape == (0, 2)
    assert tensor_digests({}) == {}


def test_formatted_sums_equal_the_definition(expected: dict[str, str]) -> None:
    tensors = cases()
    sums = digest_sums(list(tensors.values()))
    assert format_digests(list(tensors), list(tensors.values()), sums) == expected
    for (name, tensor), row in zip(tensors.items(), sums.tolist(), strict=True):
        assert format_digest(tensor.shape, tensor.dtype, row) == expected[name]


# --- what the fingerprint detects ---------------------------------------------------------------

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


@pytest.mark.parametrize("distance", [ROW_WORDS, 2**20])
def test_words_swapped_far_apart_change_the_digest(distance: int) -> None:
    tensor = torch.zeros(distance + 10, dtype=torch.int32)
    tensor[5], tensor[5 + distance] = 123, -456
    swapped = tensor.clone()
    swapped[5], swapped[5 + distance] = tensor[5 + distance], tensor[5]
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
