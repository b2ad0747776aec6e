"""Tensor digests on CUDA, where each row reduction of ``lrft.kernels`` and the direct sync's
copy run as compiled kernels: every sum against the definition evaluated in plain Python
integers, and equal to the digest of the same bytes on the host.

Skipped with a reason where CUDA is missing (CI has none).
"""

from __future__ import annotations

import pytest
import torch

from lrft.api.digest import format_digests, tensor_digests
from lrft.backends.sync._copy_plan import CopyPlan, copy_with_digest
from lrft.kernels import DigestBuffer, DigestPlan, Replay, digest_sums_many
from tests.unit.digest_cases import ROW_BYTES, cases, reference_digest
from tests.unit.test_direct_sync_digests import copy_with_digest_mismatches
from tests.unit.test_kernels_digest import digests_of_a_dirty_buffer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DEVICE = torch.device("cuda", 0)


@pytest.fixture(scope="module")
def expected() -> dict[str, str]:
    return {name: reference_digest(tensor) for name, tensor in cases().items()}


def test_digests_on_cuda_equal_the_definition(expected: dict[str, str]) -> None:
    on_device = {name: tensor.to(DEVICE) for name, tensor in cases().items()}
    assert tensor_digests(on_device) == expected  # the plain sums, eager on the device
    tensors = list(on_device.values())
    assert format_digests(list(on_device), tensors, digest_sums_many(tensors)) == expected


@pytest.mark.parametrize("staging_bytes", [ROW_BYTES, 3 * ROW_BYTES + 100])
def test_a_plan_split_into_groups_on_cuda_equals_the_definition(
    staging_bytes: int, expected: dict[str, str]
) -> None:
    tensors = {name: tensor.to(DEVICE) for name, tensor in cases().items()}
    plan = DigestPlan(list(tensors.values()), staging_bytes=staging_bytes)
    for _ in range(2):  # the second pass stages over the first one's bytes
        sums = plan.sums().tolist()
        got = {
            name: reference_digest(tensor.cpu(), (plain, weighted))
            for (name, tensor), (plain, weighted) in zip(tensors.items(), sums, strict=True)
        }
        assert got == expected


def test_a_digest_buffer_on_cuda_ignores_the_bytes_between_its_views(
    expected: dict[str, str],
) -> None:
    assert digests_of_a_dirty_buffer(DEVICE) == expected


def test_a_large_bf16_tensor_digests_as_on_the_host() -> None:
    # Many rows per tensor: the row offsets (8192 q) and int64 wrap-around at scale.
    generator = torch.Generator().manual_seed(5)
    tensor = torch.randn(4099, 1531, generator=generator).to(torch.bfloat16)
    host = tensor_digests({"w": tensor})
    assert tensor_digests({"w": tensor.to(DEVICE)}) == host
    on_device = tensor.to(DEVICE)
    assert format_digests(["w"], [on_device], digest_sums_many([on_device])) == host


def test_copy_with_digest_on_cuda_writes_the_cast_and_adds_its_sums() -> None:
    # The contiguous floating-point pairs go through the fused kernel: the values it writes
    # must be torch's casts (round to nearest even) and its sums those of the definition.
    assert copy_with_digest_mismatches(DEVICE) == []


def test_copy_with_digest_on_cuda_many_tensors_and_rows() -> None:
    # More tensors than one search step covers, and several thousand rows, in one launch.
    generator = torch.Generator().manual_seed(3)
    sources = [torch.randn(int(n), generator=generator) for n in torch.randint(1, 40_000, (300,))]
    sources.append(torch.randn(3000, 1537, generator=generator))
    targets = [torch.empty(s.shape, dtype=torch.bfloat16, device=DEVICE) for s in sources]
    out = torch.zeros((len(sources), 2), dtype=torch.int64, device=DEVICE)
    copy_with_digest([s.to(DEVICE) for s in sources], targets, list(range(len(sources))), out)
    casts = {str(i): s.to(torch.bfloat16) for i, s in enumerate(sources)}
    written = {str(i): t.cpu() for i, t in enumerate(targets)}
    assert all(torch.equal(written[k], casts[k]) for k in casts)
    sums = out.cpu().tolist()
    got = {k: reference_digest(casts[k], (sums[int(k)][0], sums[int(k)][1])) for k in casts}
    assert got == tensor_digests(casts)


def test_copy_with_digest_on_cuda_into_a_target_off_four_byte_alignment() -> None:
    # The kernel reads the written words back as int32: a bf16 target at an odd element offset
    # takes the copy-then-fingerprint path and must give the same result.
    generator = torch.Generator().manual_seed(4)
    source = torch.randn(5001, generator=generator)
    backing = torch.zeros(5002, dtype=torch.bfloat16, device=DEVICE)
    target = backing[1:]
    assert target.data_ptr() % 4 == 2
    out = torch.zeros((1, 2), dtype=torch.int64, device=DEVICE)
    copy_with_digest([source.to(DEVICE)], [target], [0], out)
    cast = source.to(torch.bfloat16)
    assert torch.equal(target.cpu(), cast)
    plain, weighted = out[0].tolist()
    assert reference_digest(cast, (plain, weighted)) == tensor_digests({"t": cast})["t"]


def test_a_copy_plan_on_cuda_runs_again_with_new_values_and_refuses_moved_tensors() -> None:
    generator = torch.Generator().manual_seed(6)
    sources = [torch.randn(n, generator=generator).to(DEVICE) for n in (5, 70_001, 3)]
    buffer = DigestBuffer([((s.numel(),), torch.bfloat16) for s in sources], DEVICE)
    positions = [2, 0, 1]
    plan = CopyPlan(sources, buffer.views, positions, DEVICE)
    out = torch.zeros((3, 2), dtype=torch.int64, device=DEVICE)
    # run 0 launches eagerly, run 1 captures the launches into a graph, runs 2 and 3 replay it
    for round_ in range(4):
        for source in sources:
            source.mul_(-1.5)  # new values at the same addresses
        assert plan.matches(sources, buffer.views, positions)
        out.zero_()
        plan.run(sources, buffer.views, out)
        assert plan.captured == (round_ >= 1)
        casts = {
            str(p): s.cpu().to(torch.bfloat16) for p, s in zip(positions, sources, strict=True)
        }
        assert all(
            torch.equal(v.cpu(), casts[str(p)])
            for p, v in zip(positions, buffer.views, strict=True)
        ), round_
        sums = out.cpu().tolist()
        got = {k: reference_digest(c, (sums[int(k)][0], sums[int(k)][1])) for k, c in casts.items()}
        assert got == tensor_digests(casts), round_
    assert not plan.matches([s.clone() for s in sources], buffer.views, positions)
    assert not plan.matches(sources, buffer.views, [0, 1, 2])
    # the same addresses through new view objects: an engine whose storage was replaced
    views = [v.view(v.shape) for v in buffer.views]
    assert not plan.matches(sources, views, positions)
    # a graph replays into the out it was captured with: a new out runs eagerly, then captures
    other = torch.zeros((3, 2), dtype=torch.int64, device=DEVICE)
    plan.run(sources, buffer.views, other)
    assert not plan.captured
    assert torch.equal(other, out)


def test_a_digest_buffer_on_cuda_sums_again_from_a_graph() -> None:
    generator = torch.Generator().manual_seed(7)
    specs = [((300, 7), torch.bfloat16), ((5,), torch.float32), ((70_001,), torch.bfloat16)]
    buffer = DigestBuffer(specs, DEVICE)
    for round_ in range(4):  # eager, capture, replay, replay
        values = [torch.randn(shape, generator=generator).to(dtype) for shape, dtype in specs]
        for view, value in zip(buffer.views, values, strict=True):
            view.copy_(value)
        first = buffer.sums()
        second = buffer.sums()  # a fresh tensor each call, not the graph's own output
        assert first.data_ptr() != second.data_ptr()
        sums = first.cpu().tolist()
        got = [reference_digest(v, (a, b)) for v, (a, b) in zip(values, sums, strict=True)]
        assert got == [reference_digest(v) for v in values], round_


def test_replay_runs_launches_from_a_graph_and_falls_back_where_capture_fails() -> None:
    source = torch.zeros(1000, device=DEVICE)
    total = torch.zeros(1000, device=DEVICE)

    def accumulate() -> None:
        total.add_(source)

    replay = Replay(accumulate, DEVICE)
    for round_ in range(1, 5):
        source.fill_(float(round_))
        replay()
        assert replay.captured == (round_ >= 2)
    assert torch.equal(total.cpu(), torch.full((1000,), 1.0 + 2 + 3 + 4))

    # a host read of a device value cannot be captured: the launches stay eager, and right
    seen: list[float] = []
    failing = Replay(lambda: seen.append(float(total.sum().item())), DEVICE)
    for _ in range(3):
        failing()
    assert not failing.captured
    assert seen == [10_000.0] * 3
    torch.cuda.synchronize(DEVICE)  # the device is usable after the failed capture
    assert float(total.sum()) == 10_000.0
