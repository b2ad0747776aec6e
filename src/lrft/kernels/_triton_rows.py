"""The row reduction's CUDA kernels, in Triton (see ``_reduce``).

The row reduction runs one program per row: it reads the row's words once, masks the bytes
past its tensor's end only in a tensor's last row, and writes the row's plain and weighted sums
(the weighted one already shifted by the row's place in its tensor). Elementwise torch ops would
widen every word to int64 in memory and reread it per sum, and a compiled function costs more
host time per call than the kernel takes on a bucket.

The reduction's rows are then added up per tensor by a second kernel, a chunk of a tensor's
rows per program.
"""

from __future__ import annotations

import torch
import triton  # type: ignore[import-not-found, unused-ignore]  # CUDA builds of torch ship it; nothing else imports this
import triton.language as tl  # type: ignore[import-not-found, unused-ignore]  # as above

from lrft.kernels._rows import CHUNK_ROWS


@triton.jit  # type: ignore[untyped-decorator, unused-ignore]  # Triton is untyped
def _row_sums_kernel(words, valid, offset, out, WORDS: tl.constexpr):  # type: ignore[no-untyped-def]  # a Triton kernel's arguments are pointers and constexprs
    row = tl.program_id(0).to(tl.int64)
    column = tl.arange(0, WORDS)
    word = tl.load(words + row * WORDS + column).to(tl.int64)
    kept = tl.load(valid + row)
    if kept < 4 * WORDS:
        # The definition pads a tensor's last word with zero bytes; words past it count nothing.
        cut = tl.minimum(tl.maximum(kept - 4 * column, 0), 4)
        low = word & ((tl.full([WORDS], 1, tl.int64) << (8 * cut)) - 1)
        word = tl.where(cut == 4, word, low)
    plain = tl.sum(word, axis=0)
    local = tl.sum(word * (2 * column + 1), axis=0)
    tl.store(out + 2 * row, plain)
    tl.store(out + 2 * row + 1, local + tl.load(offset + row) * plain)


def add_row_sums(
    words: torch.Tensor,
    valid: torch.Tensor,
    offset: torch.Tensor,
    chunks: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """Adds each row's plain sum and its weighted sum plus ``offset * plain``, counting the
    first ``valid`` bytes of the row (``words``: ``(rows, ROW_WORDS)`` int32), to
    ``out[tensor]`` of the tensor each chunk ``(first row, rows, tensor)`` names. Two kernels:
    the rows', then one program per chunk (``index_add_`` would add the rows' sums with an
    atomic each, serialised on the few addresses of a large tensor)."""
    if not words.shape[0]:
        return
    partial = torch.empty((words.shape[0], 2), dtype=torch.int64, device=words.device)
    _row_sums_kernel[(words.shape[0],)](
        words, valid, offset, partial, WORDS=words.shape[1], num_warps=8
    )
    _chunk_sums_kernel[(chunks.numel() // 3,)](
        chunks, partial, out, BLOCK=_CHUNK_BLOCK, STEPS=_CHUNK_STEPS, num_warps=4
    )


@triton.jit  # type: ignore[untyped-decorator, unused-ignore]  # Triton is untyped
def _chunk_sums_kernel(chunks, partial, out, BLOCK: tl.constexpr, STEPS: tl.constexpr):  # type: ignore[no-untyped-def]  # as above
    # One program per chunk of up to BLOCK * STEPS rows of one tensor adds them up: a program
    # per tensor would sum a large tensor's rows alone, and per-row atomics on one address
    # would serialise them.
    chunk = chunks + 3 * tl.program_id(0).to(tl.int64)
    first = tl.load(chunk)
    rows = tl.load(chunk + 1)
    position = tl.load(chunk + 2)
    plain = tl.zeros([BLOCK], tl.int64)
    local = tl.zeros([BLOCK], tl.int64)
    for step in tl.static_range(STEPS):
        at = step * BLOCK + tl.arange(0, BLOCK)
        kept = at < rows
        plain += tl.load(partial + 2 * (first + at), mask=kept, other=0)
        local += tl.load(partial + 2 * (first + at) + 1, mask=kept, other=0)
    # Atomic: a tensor's chunks, and two tables (two dtype pairs), may add to one output row.
    tl.atomic_add(out + 2 * position, tl.sum(plain, axis=0))
    tl.atomic_add(out + 2 * position + 1, tl.sum(local, axis=0))


_CHUNK_BLOCK = 256
_CHUNK_STEPS = CHUNK_ROWS // _CHUNK_BLOCK
