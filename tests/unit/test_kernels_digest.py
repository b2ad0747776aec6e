"""``lrft.kernels``' fingerprint sums (staged in rows, or in a digest buffer laid out in rows)
against the digest's definition in plain Python integers, and the eager replay off CUDA."""

from __future__ import annotations

import pytest
import torch

from lrft.api.digest import digest_sums, format_digests
from lrft.kernels import DigestBuffer, DigestPlan, Replay, digest_sums_many
from tests.unit.digest_cases import (
    ROW_BYTES,
    case_digests,
    case_sums,
    cases,
    reference_digest,
)


def test_staged_sums_equal_the_definition_and_the_plain_sums() -> None:
    reference = case_sums()
    tensors = list(cases().values())
    staged = digest_sums_many(tensors)
    assert torch.equal(staged, digest_sums(tensors))
    for name, sums in zip(cases(), staged.tolist(), strict=True):
        assert [s % 2**64 for s in sums] == [s % 2**64 for s in reference[name]], name


@pytest.mark.parametrize("staging_bytes", [ROW_BYTES, 2 * ROW_BYTES, 3 * ROW_BYTES + 100])
def test_tensors_split_across_staging_groups_digest_as_unsplit(staging_bytes: int) -> None:
    reference = case_sums()
    tensors = cases()
    unsplit = digest_sums_many(list(tensors.values()))
    split = digest_sums_many(list(tensors.values()), staging_bytes=staging_bytes)
    assert torch.equal(split, unsplit)
    for name, sums in zip(tensors, split.tolist(), strict=True):
        assert [s % 2**64 for s in sums] == [s % 2**64 for s in reference[name]], name


def test_a_plan_sums_what_its_tensors_hold_now() -> None:
    expected = case_digests()
    tensors = cases()
    plan = DigestPlan(list(tensors.values()), staging_bytes=2 * ROW_BYTES)
    assert format_digests(list(tensors), list(tensors.values()), plan.sums()) == expected
    tensors["fp32"].add_(1)  # the plan reads the same storage again
    changed = format_digests(list(tensors), list(tensors.values()), plan.sums())
    assert changed == {**expected, "fp32": reference_digest(tensors["fp32"])}


def test_a_staging_buffer_smaller_than_a_row_is_refused() -> None:
    with pytest.raises(ValueError, match=f"staging_bytes 100 .* one row of {ROW_BYTES} bytes"):
        digest_sums_many([torch.ones(3)], staging_bytes=100)


def test_tensors_on_two_devices_are_refused_naming_both() -> None:
    with pytest.raises(ValueError, match="tensor 0 is on cpu, tensor 1 on meta"):
        digest_sums_many([torch.ones(3), torch.ones(3, device="meta")])


def test_no_tensors_give_no_sums() -> None:
    assert digest_sums_many([]).shape == (0, 2)


def buffer_digests(buffer: DigestBuffer, names: list[str]) -> dict[str, str]:
    return format_digests(names, buffer.views, buffer.sums())


def test_a_digest_buffer_digests_what_its_views_hold() -> None:
    expected = case_digests()
    tensors = cases()
    buffer = DigestBuffer([(tuple(t.shape), t.dtype) for t in tensors.values()], "cpu")
    base = buffer.views[0].data_ptr()
    for view, tensor in zip(buffer.views, tensors.values(), strict=True):
        assert (view.shape, view.dtype) == (tensor.shape, tensor.dtype)
        if view.numel():
            assert (view.data_ptr() - base) % ROW_BYTES == 0
        view.copy_(tensor)
    assert buffer_digests(buffer, list(tensors)) == expected
    # the views alias the buffer: sums() sees later writes
    buffer.views[0].add_(1)
    changed = buffer_digests(buffer, list(tensors))
    assert changed == {**expected, "fp32": reference_digest(tensors["fp32"] + 1)}


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
    return buffer_digests(buffer, list(tensors))


def test_a_digest_buffer_ignores_the_bytes_between_its_views() -> None:
    expected = case_digests()
    assert digests_of_a_dirty_buffer("cpu") == expected


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
