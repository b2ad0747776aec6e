"""The row reduction of :mod:`lrft.api.digest` as one Triton kernel, for CUDA tensors.

One program per row: it reads the row's words once, masks the bytes past its tensor's end only
in a tensor's last row, and writes the row's plain and weighted sums (the weighted one already
shifted by the row's place in its tensor). Elementwise torch ops would widen every word to int64
in memory and reread it per sum, and a compiled function costs more host time per call than the
kernel takes on a bucket.
"""

from __future__ import annotations

from array import array

import torch
import triton  # type: ignore[import-not-found, unused-ignore]  # CUDA builds of torch ship it; nothing else imports this
import triton.language as tl  # type: ignore[import-not-found, unused-ignore]  # as above

from lrft.api._digest_rows import CopyTable


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


def row_sums(words: torch.Tensor, valid: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """``(rows, 2)`` int64: each row's plain sum and its weighted sum plus ``offset * plain``,
    counting the first ``valid`` bytes of the row (``words``: ``(rows, ROW_WORDS)`` int32)."""
    out = torch.empty((words.shape[0], 2), dtype=torch.int64, device=words.device)
    if words.shape[0]:
        _row_sums_kernel[(words.shape[0],)](
            words, valid, offset, out, WORDS=words.shape[1], num_warps=8
        )
    return out


@triton.jit  # type: ignore[untyped-decorator, unused-ignore]  # Triton is untyped
def _copy_rows_kernel(  # type: ignore[no-untyped-def]  # a Triton kernel's arguments are pointers and constexprs
    table,
    partial,
    WORDS: tl.constexpr,
    PER_WORD: tl.constexpr,
    SOURCE: tl.constexpr,
    TARGET: tl.constexpr,
    BITS: tl.constexpr,
    SEARCH: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    # The entry this row belongs to: the last one whose first row is at most `row`. A binary
    # search over the table costs a few cached loads; a per-row table would cost kernels and
    # host time per bucket.
    lower = tl.zeros([], tl.int64)
    upper = tl.full([], 1 << SEARCH, tl.int64)
    for _ in tl.static_range(SEARCH):
        middle = (lower + upper) // 2
        right = tl.load(table + 5 * middle) <= row
        lower = tl.where(right, middle, lower)
        upper = tl.where(right, upper, middle)
    entry = table + 5 * lower
    within = row - tl.load(entry)
    source = tl.load(entry + 1).to(tl.pointer_type(SOURCE))
    target = tl.load(entry + 2).to(tl.pointer_type(TARGET))
    numel = tl.load(entry + 3)
    column = tl.arange(0, WORDS)
    # The row as a (WORDS, PER_WORD) tile: the elements of word p side by side, so that the
    # words come out of the values written without moving them between threads.
    part = tl.arange(0, PER_WORD)
    index = within * (WORDS * PER_WORD) + PER_WORD * column[:, None] + part[None, :]
    kept = index < numel
    value = tl.load(source + index, mask=kept, other=0).to(TARGET)
    tl.store(target + index, value, mask=kept)
    # Elements past the end are 0 here: the definition's zero padding.
    bits = value.to(BITS, bitcast=True).to(tl.int32)
    if PER_WORD == 2:
        # Little-endian: element 2p is the word's low half. The halves' bits are disjoint, so
        # their int32 sum is the word.
        bits = (bits & 0xFFFF) << (16 * part[None, :])
    word = tl.sum(bits, axis=1).to(tl.int64)
    plain = tl.sum(word, axis=0)
    local = tl.sum(word * (2 * column.to(tl.int64) + 1), axis=0)
    tl.store(partial + 2 * row, plain)
    tl.store(partial + 2 * row + 1, local + within * (2 * WORDS) * plain)


@triton.jit  # type: ignore[untyped-decorator, unused-ignore]  # Triton is untyped
def _entry_sums_kernel(table, partial, out, ROW_ELEMENTS: tl.constexpr, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]  # as above
    # One program per tensor adds up its rows' sums: per-row atomics on one address would
    # serialise a large tensor's rows.
    entry = table + 5 * tl.program_id(0).to(tl.int64)
    first = tl.load(entry)
    rows = (tl.load(entry + 3) + ROW_ELEMENTS - 1) // ROW_ELEMENTS
    position = tl.load(entry + 4)
    plain = tl.zeros([BLOCK], tl.int64)
    local = tl.zeros([BLOCK], tl.int64)
    for start in range(0, rows, BLOCK):
        at = first + start + tl.arange(0, BLOCK)
        kept = start + tl.arange(0, BLOCK) < rows
        plain += tl.load(partial + 2 * at, mask=kept, other=0)
        local += tl.load(partial + 2 * at + 1, mask=kept, other=0)
    # Atomic: two tables (two dtype pairs) may add to one output row.
    tl.atomic_add(out + 2 * position, tl.sum(plain, axis=0))
    tl.atomic_add(out + 2 * position + 1, tl.sum(local, axis=0))


_TRITON_DTYPES = {
    torch.float32: (tl.float32, tl.int32),
    torch.bfloat16: (tl.bfloat16, tl.int16),
    torch.float16: (tl.float16, tl.int16),
}
# Measured on an H200 (fp32 into bf16, W1's and the 1.5B model's tensors): rows of 2048 words
# with 4 warps ran 1.07 and 3.61 ms, 4096 words with 8 warps 1.28 and 4.39 ms.
COPY_WORDS = 2048
"""Words per row of :func:`copy_sums` (any length gives the same sums)."""
_COPY_WARPS = 4
COPY_DTYPES = frozenset(_TRITON_DTYPES)
"""The source and target dtypes :func:`copy_sums` takes."""


def copy_sums(table: CopyTable, out: torch.Tensor) -> None:
    """Copies each tensor of ``table`` from its source to its target address (cast to the
    target dtype) and adds the fingerprint sums of the values written to ``out[position]``
    (``(k, 2)`` int64), in two kernels (one per row, one per tensor). The caller checked every tensor: contiguous, on
    ``out``'s CUDA device, of the table's dtypes (both in :data:`COPY_DTYPES`)."""
    if not table.rows:
        return
    facts = table.facts
    count = len(facts) // 5
    search = max(1, (count - 1).bit_length())
    # The search may probe up to entry 2**search - 1: entries past the last start beyond every row.
    padded = array("q", facts)
    padded.extend([1 << 62, 0, 0, 0, 0] * ((1 << search) - count))
    # Pinned and non-blocking: the table is queued behind the kernels before it, no host sync.
    # (An array becomes a tensor without a Python step per value.)
    host = torch.frombuffer(padded, dtype=torch.int64).pin_memory()
    on_device = host.to(out.device, non_blocking=True)
    target, bits = _TRITON_DTYPES[table.target]
    per_word = 4 // table.target.itemsize
    partial = torch.empty((table.rows, 2), dtype=torch.int64, device=out.device)
    _copy_rows_kernel[(table.rows,)](
        on_device,
        partial,
        WORDS=table.words,
        PER_WORD=per_word,
        SOURCE=_TRITON_DTYPES[table.source][0],
        TARGET=target,
        BITS=bits,
        SEARCH=search,
        num_warps=_COPY_WARPS,
    )
    _entry_sums_kernel[(count,)](
        on_device, partial, out, ROW_ELEMENTS=table.words * per_word, BLOCK=256, num_warps=4
    )
