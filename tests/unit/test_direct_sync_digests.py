"""The direct sync's digest machinery against the digest's definition in plain Python integers:
the sent fingerprints queued on the device, the report's combined digest, and the cast copy that
fingerprints what it writes (one call, or a plan run again)."""

from __future__ import annotations

import pytest
import torch

from lrft.api.digest import combine_digests, digest_sums, tensor_digests
from lrft.backends.sync._copy_plan import CopyPlan, copy_with_digest
from lrft.backends.sync._digests import CombinedDigest, PendingDigests
from lrft.kernels import ROW_WORDS, DigestBuffer
from tests.unit.digest_cases import cases, reference_digest, reference_sums


def test_pending_digests_of_a_buffer_equal_the_definition() -> None:
    tensors = cases()
    buffer = DigestBuffer([(tuple(t.shape), t.dtype) for t in tensors.values()], "cpu")
    for view, tensor in zip(buffer.views, tensors.values(), strict=True):
        view.copy_(tensor)
    pending = PendingDigests()
    pending.add_buffer(list(tensors), buffer)
    assert pending.resolve() == {name: reference_digest(t) for name, t in tensors.items()}


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
        sums = digest_sums(specs)
        assert combined.of(sums) == combine_digests(tensor_digests(tensors))
        for tensor in specs:
            tensor.add_(1)


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
