"""The row machinery behind :mod:`lrft.api.digest`: how tensors are laid out in rows of a
staging or digest buffer, the per-row tables the reduction reads, and the reduction itself
(a Triton kernel on CUDA, eager torch elsewhere). See that module for the definition."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

ROW_WORDS = 4096
"""Words in one row of a staging buffer; every tensor starts at a row boundary."""
STAGING_BYTES = 64 << 20
"""The largest staging buffer :func:`digest_sums_many` allocates; larger inputs are split."""
CHUNK_ROWS = 1024
"""Rows of one tensor that one program of the device kernels' second pass adds up."""

ROW_BYTES = ROW_WORDS * 4
# The eager reduction views a row as a (_SIDE, _SIDE) block: 2 * _SIDE weights instead of one per
# word.
_SIDE = 64
# The block's row and column weights, per device, made once.
_SIDE_WEIGHTS: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


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


def _side_weights(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    cached = _SIDE_WEIGHTS.get(device)
    if cached is None:
        side = torch.arange(_SIDE, dtype=torch.int64, device=device)
        cached = (side * (2 * _SIDE), side * 2 + 1)
        _SIDE_WEIGHTS[device] = cached
    return cached


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host table on ``device``: on CUDA queued behind the work before it, no sync."""
    if device.type == "cuda":
        # A blocking copy from pageable memory waits for every kernel queued before it; a pinned
        # non-blocking one is only queued, so the digests stay free of host syncs.
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def row_layout(pieces: Sequence[Piece], device: torch.device) -> Rows:
    """The rows of ``pieces`` (which cover rows 0, 1, ... in order), expanded on ``device`` from
    one small transfer of per-piece facts: per-row tables built on the host would cost more
    than the digest of a large bucket."""
    total = pieces[-1].row + pieces[-1].rows if pieces else 0
    partial = [p.row + p.rows - 1 for p in pieces if p.nbytes % ROW_BYTES]
    facts = [value for p in pieces for value in (p.tensor, p.row, p.first_row, p.nbytes, p.rows)]
    on_kernel = device.type == "cuda" and device_kernel() is not None
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


def _zero_tails(words: torch.Tensor, rows: Rows) -> None:
    """Zeroes the bytes of each partial row past its tensor's end (padding, which no tensor
    view covers), so that whole-row sums count them as the definition's zero padding."""
    if rows.partial.numel():
        words[rows.partial] = words[rows.partial] & rows.tail_masks


@functools.cache
def device_kernel() -> (
    Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None] | None
):
    try:
        from lrft.api._digest_kernel import add_row_sums
    except ImportError:  # a torch build without Triton: the eager reduction, slower but equal
        return None
    return add_row_sums


class CopyTable:
    """The fused copy kernel's table for one pair of dtypes: per tensor its first row (of
    ``words`` words of the target) among all the table's rows, the source and target addresses,
    the element count and the position its sums go to."""

    def __init__(self, source: torch.dtype, target: torch.dtype, words: int) -> None:
        self.source = source
        self.target = target
        self.words = words
        self.facts: list[int] = []
        self.rows = 0
        self._row_elements = words * 4 // target.itemsize

    def add(self, source: int, target: int, numel: int, position: int) -> None:
        if numel:
            self.facts += (self.rows, source, target, numel, position)
            self.rows += -(-numel // self._row_elements)


class CopyKernel(NamedTuple):
    """The fused copy-and-fingerprint kernels: ``prepare`` moves a :class:`CopyTable` to the
    device, ``launch`` runs the copy it describes; and the dtypes and row length they take."""

    prepare: Callable[[CopyTable, torch.device], object]
    # Any: the prepared table's type lives in the Triton module, importable only with Triton.
    launch: Callable[[Any, torch.Tensor], None]
    dtypes: frozenset[torch.dtype]
    words: int


@functools.cache
def copy_kernel() -> CopyKernel | None:
    try:
        from lrft.api._digest_kernel import COPY_DTYPES, COPY_WORDS, launch_copy, prepare_copy
    except ImportError:  # a torch build without Triton: copy, then fingerprint the copies
        return None
    return CopyKernel(prepare_copy, launch_copy, COPY_DTYPES, COPY_WORDS)


def _unmasked_row_sums(words: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(plain, local)`` of whole rows, in int64 temporaries bounded to a few times
    :data:`STAGING_BYTES`. A row viewed as a 64 x 64 block gives the word at ``(i, j)`` the
    position ``64 i + j``, so ``local`` follows from the block's 64 row sums (``across``) and 64
    column sums (``down``): ``sum_i 128 i * across_i + sum_j (2j + 1) * down_j``.

    int64 products and sums wrap in two's complement: that is the definition's arithmetic
    modulo ``2**64``, not an overflow to avoid."""
    by_row, by_column = _side_weights(words.device)
    plain = torch.empty(words.shape[0], dtype=torch.int64, device=words.device)
    local = torch.empty_like(plain)
    chunk = STAGING_BYTES // ROW_BYTES
    for first in range(0, words.shape[0], chunk):
        block = words[first : first + chunk].view(-1, _SIDE, _SIDE)
        if words.is_cuda:
            # Reductions that accumulate in int64 read each word once.
            across = block.sum(2, dtype=torch.int64)
            down = block.sum(1, dtype=torch.int64)
        else:
            # On the host one shared int64 copy is faster than two widening reductions.
            wide = block.to(torch.int64)
            across = wide.sum(2)
            down = wide.sum(1)
        plain[first : first + chunk] = across.sum(1)
        local[first : first + chunk] = (across * by_row).sum(1) + (down * by_column).sum(1)
    return plain, local


def add_row_sums(words: torch.Tensor, rows: Rows, out: torch.Tensor) -> None:
    """Adds the sums of each row of ``words`` (``(rows, ROW_WORDS)`` int32) to ``out[tensor]``
    (``(k, 2)`` int64) of the tensor ``rows`` names for it. Integer addition is exact and
    order-independent, so ``index_add_`` is deterministic on every device."""
    if words.shape[0] == 0:
        return
    kernel = device_kernel() if words.is_cuda else None
    if kernel is not None:
        kernel(words, rows.valid, rows.offset, rows.chunks, out)
        return
    _zero_tails(words, rows)
    plain, local = _unmasked_row_sums(words)
    sums = torch.stack([plain, torch.addcmul(local, rows.offset, plain)], dim=1)
    out.index_add_(0, rows.tensor, sums)


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


class _BufferLayout(NamedTuple):
    rows: int
    starts: list[int]  # each tensor's byte offset in the buffer
    table: Rows


@functools.lru_cache(maxsize=256)
def buffer_layout(
    specs: tuple[tuple[tuple[int, ...], torch.dtype], ...], device: torch.device
) -> _BufferLayout:
    """The layout of a :class:`DigestBuffer`, kept per distinct list of specs and device: a
    sync lays out the same buckets every time, and building the row table costs more host time
    than digesting a bucket on a GPU."""
    sizes = []
    for shape, dtype in specs:
        if any(d < 0 for d in shape):
            raise ValueError(f"DigestBuffer shape {shape} has a negative dimension")
        numel = 1
        for d in shape:
            numel *= d
        sizes.append(numel * dtype.itemsize)
    # one group, nothing split: every tensor lies whole at its own row offset
    groups = row_groups(sizes, sys.maxsize)
    pieces = groups[0] if groups else []
    start = {p.tensor: p.row * ROW_BYTES for p in pieces}
    return _BufferLayout(
        rows=pieces[-1].row + pieces[-1].rows if pieces else 0,
        starts=[start.get(i, 0) for i in range(len(specs))],
        table=row_layout(pieces, device),
    )
