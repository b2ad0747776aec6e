"""How tensors are laid out in rows of a staging or digest buffer, and the per-row tables the
reduction (``_reduce``) reads. See :mod:`lrft.kernels` for the layout and :mod:`lrft.api.digest`
for the definition of the sums."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

ROW_WORDS = 4096
"""Words in one row of a staging buffer; every tensor starts at a row boundary."""
STAGING_BYTES = 64 << 20
"""The largest staging buffer :func:`digest_sums_many` allocates; larger inputs are split."""
CHUNK_ROWS = 1024
"""Rows of one tensor that one program of the device kernels' second pass adds up."""

ROW_BYTES = ROW_WORDS * 4


class Piece(NamedTuple):
    """``rows`` rows of tensor ``tensor``, from its row ``first_row``, staged at row ``row``;
    ``nbytes`` of them belong to the tensor."""

    tensor: int
    row: int
    first_row: int
    rows: int
    nbytes: int


class Rows(NamedTuple):
    """What the reduction needs to know of each staged row, on the buffer's device."""

    # (rows,) the tensor the row belongs to, for the eager reduction; empty for the device
    # kernels, which read `chunks`
    tensor: torch.Tensor
    offset: torch.Tensor  # (rows,) 2 * ROW_WORDS * q for the row's index q within its tensor
    valid: torch.Tensor  # (rows,) bytes of the row that belong to its tensor
    partial: torch.Tensor  # (m,) the rows with fewer than ROW_BYTES valid bytes
    # (m, ROW_WORDS) int32 masks that keep only the valid bytes of each partial row, for the
    # eager reduction; empty where the device kernel masks as it reads
    tail_masks: torch.Tensor
    # (first row, rows, tensor) of each run of up to CHUNK_ROWS rows of one tensor, flat, for
    # the device kernels; empty for the eager reduction
    chunks: torch.Tensor


def _rows_of(nbytes: int) -> int:
    return -(-nbytes // ROW_BYTES)


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host table on ``device``: on CUDA queued behind the work before it, no sync."""
    if device.type == "cuda":
        # A blocking copy from pageable memory waits for every kernel queued before it; a pinned
        # non-blocking one is only queued, so the digests stay free of host syncs.
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def row_layout(pieces: Sequence[Piece], device: torch.device, *, on_kernel: bool) -> Rows:
    """The rows of ``pieces`` (which cover rows 0, 1, ... in order), expanded on ``device`` from
    one small transfer of per-piece facts: per-row tables built on the host would cost more
    than the digest of a large bucket. ``on_kernel``: the tables of the device kernels
    (``_reduce.uses_kernel``), else those of the eager reduction."""
    total = pieces[-1].row + pieces[-1].rows if pieces else 0
    partial = [p.row + p.rows - 1 for p in pieces if p.nbytes % ROW_BYTES]
    facts = [value for p in pieces for value in (p.tensor, p.row, p.first_row, p.nbytes, p.rows)]
    chunks = (
        [
            value
            for p in pieces
            for start in range(0, p.rows, CHUNK_ROWS)
            for value in (p.row + start, min(CHUNK_ROWS, p.rows - start), p.tensor)
        ]
        if on_kernel
        else []
    )
    moved = to_device(torch.tensor(facts + partial + chunks, dtype=torch.int64), device)
    meta = moved[: len(facts)].view(-1, 5).t()
    counts = meta[4]

    def per_row(values: torch.Tensor) -> torch.Tensor:
        # output_size: the total is known here, so CUDA needs no host sync to size the result
        return torch.repeat_interleave(values, counts, output_size=total)

    within = torch.arange(total, dtype=torch.int64, device=device) - per_row(meta[1])
    valid = (per_row(meta[3]) - within * ROW_BYTES).clamp(0, ROW_BYTES)
    partial_rows = moved[len(facts) : len(facts) + len(partial)]
    if on_kernel:
        tensor = torch.empty(0, dtype=torch.int64, device=device)
        tail_masks = torch.empty((0, ROW_WORDS), dtype=torch.int32, device=device)
    else:
        tensor = per_row(meta[0])
        column = torch.arange(ROW_WORDS, dtype=torch.int64, device=device)
        kept = (valid[partial_rows][:, None] - 4 * column).clamp(0, 4)
        # bytes kept per word -> the word's mask: 4 -> all bits (-1 as int32), 0 -> none
        tail_masks = (torch.bitwise_left_shift(torch.ones_like(kept), 8 * kept) - 1).to(torch.int32)
    return Rows(
        tensor=tensor,
        offset=(within + per_row(meta[2])) * (2 * ROW_WORDS),
        valid=valid,
        partial=partial_rows,
        tail_masks=tail_masks,
        chunks=moved[len(facts) + len(partial) :],
    )


def device_of(tensors: Sequence[torch.Tensor]) -> torch.device:
    if not tensors:
        return torch.device("cpu")
    device = tensors[0].device
    for position, tensor in enumerate(tensors):
        if tensor.device != device:
            raise ValueError(
                f"digest_sums_many needs every tensor on one device: tensor 0 is on {device}, "
                f"tensor {position} on {tensor.device}"
            )
    return device


def row_groups(sizes: Sequence[int], capacity: int) -> list[list[Piece]]:
    """Row-aligned pieces of tensors of ``sizes`` bytes, in groups of at most ``capacity`` rows;
    a tensor that does not fit the rest of a group continues in the next one."""
    groups: list[list[Piece]] = []
    pieces: list[Piece] = []
    used = 0
    for tensor, nbytes in enumerate(sizes):
        rows = _rows_of(nbytes)
        done = 0
        while done < rows:
            if used == capacity:
                groups.append(pieces)
                pieces, used = [], 0
            take = min(rows - done, capacity - used)
            end = min(nbytes, (done + take) * ROW_BYTES)
            pieces.append(Piece(tensor, used, done, take, end - done * ROW_BYTES))
            used += take
            done += take
    if pieces:
        groups.append(pieces)
    return groups


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    step = 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))
