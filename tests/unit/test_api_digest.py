"""The tensor digest against its definition, evaluated in plain Python integers."""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from lrft.api import combine_digests, tensor_digest
from lrft.api._replay import Replay
from lrft.api.digest import (
    ROW_WORDS,
    CombinedDigest,
    CopyPlan,
    DigestBuffer,
    PendingDigests,
    copy_with_digest,
    digest_sums_many,
    tensor_digests,
)

ROW_BYTES = ROW_WORDS * 4


def reference_sums(tensor: torch.Tensor) -> tuple[int, int]:
    """``sum(w_p)`` and ``sum((2p + 1) * w_p)`` over the little-endian signed 32-bit words of
    the tensor's bytes (last word zero-padded), before reduction modulo ``2**64``."""
    raw = bytes(tensor.contiguous().reshape(-1).view(torch.uint8).tolist())
    raw += bytes(-len(raw) % 4)
    words = [int.from_bytes(raw[i : i + 4], "little", signed=True) for i in range(0, len(raw), 4)]
    return sum(words), sum((2 * p + 1) * w for p, w in enumerate(words))


def reference_digest(tensor: torch.Tensor, sums: tuple[int, int] | None = None) -> str:
    plain, weighted = reference_sums(tensor) if sums is None else sums
    dims = "x".join(str(d) for d in tensor.shape)
    dtype = str(tensor.dtype).removeprefix("torch.")
    return f"{dtype}[{dims}]:{plain % 2**64:016x}{weighted % 2**64:016x}"


def random_words(count: int, seed: int, low: int = -(2**31), high: int = 2**31) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, (count,), generator=generator, dtype=torch.int64).to(
        torch.int32
    )


def cases() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    matrix = torch.randn(40, 70, generator=generator)
    return {
        "fp32": torch.randn(3, 1000, generator=generator),
        "bf16": torch.randn(7, 333, generator=generator).to(torch.bfloat16),
        "fp16": torch.randn(2049, generator=generator).to(torch.float16),
        "int64": torch.randint(-(2**62), 2**62, (999,), generator=generator),
        "uint8": torch.randint(0, 256, (10_001,), generator=generator, dtype=torch.uint8),
        "bool": torch.rand(77, generator=generator) > 0.5,
        "three_bf16": torch.randn(3, generator=generator).to(torch.bfloat16),
        "five_uint8": torch.tensor([255, 1, 128, 7, 9], dtype=torch.uint8),
        "scalar": torch.tensor(-3.5),
        "empty": torch.empty(0, 5),
        "transposed": matrix.t(),
        "strided": matrix[::3, 1::2],
        "one_row": random_words(ROW_WORDS, 1),
        "one_row_and_a_word": random_words(ROW_WORDS + 1, 2),
        # large enough that the sums leave the int64 range before the modulo
        "large_signed": random_words(300_000, 3, high=2**30),
        "large_positive": random_words(250_000, 4, low=0),
    }


@pytest.fixture(scope="module")
def reference() -> dict[str, tuple[int, int]]:
    return {name: reference_sums(tensor) for name, tensor in cases().items()}


@pytest.fixture(scope="module")
def expected(reference: dict[str, tuple[int, int]]) -> dict[str, str]:
    return {name: reference_digest(t, reference[name]) for name, t in cases().items()}


def test_the_cases_wrap_around_and_are_laid_out_as_named(
    reference: dict[str, tuple[int, int]],
) -> None:
    tensors = cases()
    assert not tensors["transposed"].is_contiguous()
    assert not tensors["strided"].is_contiguous()
    assert tensors["one_row"].numel() * 4 == ROW_BYTES
    assert max(reference["large_positive"]) >= 2**63
    assert min(reference["large_signed"]) < -(2**63)


def test_each_digest_equals_its_definition(expected: dict[str, str]) -> None:
    for name, tensor in cases().items():
        assert tensor_digest(tensor) == expected[name], name


def test_batched_digests_equal_the_definition(expected: dict[str, str]) -> None:
    assert tensor_digests(cases()) == expected


@pytest.mark.parametrize("staging_bytes", [ROW_BYTES, 2 * ROW_BYTES, 3 * ROW_BYTES + 100])
def test_tensors_split_across_staging_groups_digest_as_unsplit(
    staging_bytes: int, reference: dict[str, tuple[int, int]]
) -> None:
    tensors = cases()
    unsplit = digest_sums_many(list(tensors.values()))
    split = digest_sums_many(list(tensors.values()), staging_bytes=staging_bytes)
    assert torch.equal(split, unsplit)
    for name, sums in zip(tensors, split.tolist(), strict=True):
        assert [s % 2**64 for s in sums] == [s % 2**64 for s in reference[name]], name


def test_a_staging_buffer_smaller_than_a_row_is_refused() -> None:
    with pytest.raises(ValueError, match=f"staging_bytes 100 .* one row of {ROW_BYTES} bytes"):
        digest_sums_many([torch.ones(3)], staging_bytes=100)


def test_tensors_on_two_devices_are_refused_naming_both() -> None:
    with pytest.raises(ValueError, match="tensor 0 is on cpu, tensor 1 on meta"):
        digest_sums_many([torch.ones(3), torch.ones(3, device="meta")])


def test_no_tensors_give_no_sums() -> None:
    assert digest_sums_many([]).shape == (0, 2)
    assert tensor_digests({}) == {}


def test_a_digest_buffer_digests_what_its_views_hold(expected: dict[str, str]) -> None:
    tensors = cases()
    buffer = DigestBuffer([(tuple(t.shape), t.dtype) for t in tensors.values()], "cpu")
    base = buffer.views[0].data_ptr()
    for view, tensor in zip(buffer.views, tensors.values(), strict=True):
        assert (view.shape, view.dtype) == (tensor.shape, tensor.dtype)
        if view.numel():
            assert (view.data_ptr() - base) % ROW_BYTES == 0
        view.copy_(tensor)
    pending = PendingDigests()
    pending.add_buffer(list(tensors), buffer)
    assert pending.resolve() == expected
    # the views alias the buffer: sums() sees later writes
    buffer.views[0].add_(1)
    pending.add_buffer(list(tensors), buffer)
    changed = pending.resolve()
    assert changed["fp32"] == reference_digest(tensors["fp32"] + 1)
    assert {k: v for k, v in changed.items() if k != "fp32"} == {
        k: v for k, v in expected.items() if k != "fp32"
    }


def digests_of_a_dirty_buffer(device: torch.device | str) -> dict[str, str]:
    """The digests of :func:`cases` written into a :class:`DigestBuffer` on ``device`` whose
    every byte held 0xAB before: the buffer is never zeroed, so whatever lies past each
    tensor's last byte must not reach the sums."""
    tensors = cases()
    buffer = DigestBuffer([(tuple(t.shape), t.dtype) for t in tensors.values()], device)
    whole = buffer.views[0].reshape(-1).view(torch.uint8).as_strided((buffer.nbytes,), (1,), 0)
    whole.fill_(0xAB)
    for view, tensor in zip(buffer.views, tensors.values(), strict=True):
        view.copy_(tensor)
    pending = PendingDigests()
    pending.add_buffer(list(tensors), buffer)
    return pending.resolve()


def test_a_digest_buffer_ignores_the_bytes_between_its_views(expected: dict[str, str]) -> None:
    assert digests_of_a_dirty_buffer("cpu") == expected


def copy_with_digest_mismatches(device: torch.device | str) -> list[str]:
    """Copies sources of several dtype pairs and layouts into targets on ``device`` with
    :func:`copy_with_digest`, into an ``out`` that already holds sums; returns every target
    that is not the torch cast of its source and every ``out`` row that is not its old value
    plus the definition's sums of that cast (Python integers). Empty when all is right."""
    generator = torch.Generator().manual_seed(11)
    matrix = torch.randn(300, 70, generator=generator)
    pairs = [
        (torch.randn(3, generator=generator), torch.bfloat16),
        (torch.randn(2 * 2 * ROW_WORDS + 3, generator=generator), torch.bfloat16),
        (torch.empty(0, 4), torch.bfloat16),
        (torch.randn(17, 1001, generator=generator), torch.bfloat16),
        (torch.tensor(2.5), torch.bfloat16),
        (torch.randn(5, 7, generator=generator).to(torch.bfloat16), torch.bfloat16),
        (torch.randn(ROW_WORDS + 1, generator=generator), torch.float32),
        (torch.randn(999, generator=generator).to(torch.float16), torch.float32),
        (matrix.t(), torch.bfloat16),  # not contiguous
        (torch.randint(-(2**62), 2**62, (77,), generator=generator), torch.int64),
    ]
    sources = [source.to(device) for source, _ in pairs]
    targets = [torch.full(s.shape, 3, dtype=dtype, device=device) for s, dtype in pairs]
    positions = [7, 0, 3, 9, 1, 10, 2, 5, 4, 8]  # row 6 is nobody's
    start = torch.randint(-(2**62), 2**62, (11, 2), generator=generator)
    out = start.to(device, copy=True)
    copy_with_digest(sources, targets, positions, out)
    got = out.cpu().tolist()
    wrong = []
    for i, ((source, dtype), target) in enumerate(zip(pairs, targets, strict=True)):
        cast = source.to(dtype)
        if not torch.equal(target.cpu(), cast):
            wrong.append(f"target {i} is not the cast of its source")
        plain, weighted = reference_sums(cast)
        before = start[positions[i]].tolist()
        want = [(before[0] + plain) % 2**64, (before[1] + weighted) % 2**64]
        if [v % 2**64 for v in got[positions[i]]] != want:
            wrong.append(f"out row {positions[i]} (tensor {i}) is not its old value plus the sums")
    if got[6] != start[6].tolist():
        wrong.append("out row 6, which no tensor names, changed")
    return wrong


def test_copy_with_digest_writes_the_cast_and_adds_its_sums() -> None:
    assert copy_with_digest_mismatches("cpu") == []


def test_copy_with_digest_refuses_a_shape_mismatch_naming_it() -> None:
    out = torch.zeros((1, 2), dtype=torch.int64)
    with pytest.raises(ValueError, match=r"source 0 has shape \(3,\), its target \(4,\)"):
        copy_with_digest([torch.zeros(3)], [torch.zeros(4)], [0], out)


def test_a_combined_digest_prepared_once_equals_combining_the_formatted_digests() -> None:
    generator = torch.Generator().manual_seed(12)
    tensors = {
        "z.weight": torch.randn(3, 5, generator=generator).to(torch.bfloat16),
        "a.bias": torch.randn(7, generator=generator),
        "m.scale": torch.tensor(1.5, dtype=torch.float16),
        "b.empty": torch.empty(0, 2),
    }
    names = list(tensors)
    specs = list(tensors.values())
    combined = CombinedDigest(names, specs)
    for _ in range(2):  # the same layout, other sums
        sums = digest_sums_many(specs)
        assert combined.of(sums) == combine_digests(tensor_digests(tensors))
        for tensor in specs:
            tensor.add_(1)


def test_a_digest_buffer_rejects_a_wrong_number_of_names() -> None:
    buffer = DigestBuffer([((2,), torch.float32)], "cpu")
    with pytest.raises(ValueError, match="2 names for a buffer of 1 tensors"):
        PendingDigests().add_buffer(["a", "b"], buffer)


def test_pending_digests_keep_only_sums_and_the_latest_per_name() -> None:
    generator = torch.Generator().manual_seed(1)
    named = {f"t{i}": torch.randn(i * 37 + 1, generator=generator) for i in range(5)}
    expected = {name: reference_digest(tensor) for name, tensor in named.items()}
    pending = PendingDigests()
    pending.add_many(list(named.items())[:3])
    for name, tensor in list(named.items())[3:]:
        pending.add(name, tensor)
    for tensor in named.values():
        tensor.zero_()  # only the sums are kept: the tensors may be reused at once
    assert len(pending) == 5
    assert pending.resolve() == expected
    pending.add("t0", named["t0"])
    assert len(pending) == 5
    assert pending.resolve() == {**expected, "t0": reference_digest(torch.zeros(1))}


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


def test_replay_off_cuda_runs_its_launches_eagerly_every_time() -> None:
    total = torch.zeros(3)
    calls: list[int] = []

    def launch() -> None:
        calls.append(len(calls))
        total.add_(1.0)

    replay = Replay(launch, torch.device("cpu"))
    for _ in range(3):
        replay()
    assert not replay.captured
    assert calls == [0, 1, 2]
    assert torch.equal(total, torch.full((3,), 3.0))


def test_a_copy_plan_matches_only_sources_and_targets_as_they_were() -> None:
    sources = [torch.randn(4, 6), torch.randn(9)]
    targets = [torch.zeros(4, 6, dtype=torch.bfloat16), torch.zeros(9, dtype=torch.bfloat16)]
    plan = CopyPlan(sources, targets, [1, 0], torch.device("cpu"))
    assert not plan.captured  # off CUDA every tensor is copied eagerly
    assert plan.matches(sources, targets, [1, 0])
    assert plan.matches_sources([s.mul_(2) for s in sources])  # new values, same places
    first, second = sources
    moved = [first.clone(), second]
    reshaped = [first.view(6, 4), second]
    transposed = [first.t(), second]
    retyped = [first.view(torch.int32), second]
    for other in (moved, reshaped, transposed, retyped):
        assert not plan.matches_sources(other)
        assert not plan.matches(other, targets, [1, 0])
    assert not plan.matches(sources, [targets[0].clone(), targets[1]], [1, 0])
    assert not plan.matches(sources, [targets[0].view(4, 6), targets[1]], [1, 0])  # new view
    assert not plan.matches(sources, targets, [0, 1])
    out = torch.zeros((2, 2), dtype=torch.int64)
    plan.run(sources, targets, out)
    assert all(torch.equal(t, s.to(torch.bfloat16)) for s, t in zip(sources, targets, strict=True))
    wrapped = [[v % 2**64 for v in row] for row in out.tolist()]
    expected = [[v % 2**64 for v in reference_sums(t)] for t in (targets[1], targets[0])]
    assert wrapped == expected
