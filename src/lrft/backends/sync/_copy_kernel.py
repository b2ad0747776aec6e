"""The direct sync's copy kernel, in Triton: the cast copy that fingerprints what it writes
(``copy_with_digest``).

The copy runs a few rows per program: each row is cast and written, then its words are read
back and summed like the digest's row reduction (``lrft.kernels``), and the program adds its
rows' sums to their tensors' with atomics, in the same kernel.
"""

from __future__ import annotations

from array import array
from typing import NamedTuple

import torch
import triton  # type: ignore[import-not-found, unused-ignore]  # CUDA builds of torch ship it; nothing else imports this
import triton.language as tl  # type: ignore[import-not-found, unused-ignore]  # as above

from lrft.backends.sync._copy_table import CopyTable
from lrft.kernels import to_device


@triton.jit  # type: ignore[untyped-decorator, unused-ignore]  # Triton is untyped
def _copy_rows_kernel(  # type: ignore[no-untyped-def]  # a Triton kernel's arguments are pointers and constexprs
    table,
    out,
    total,
    WORDS: tl.constexpr,
    PER_WORD: tl.constexpr,
    SOURCE: tl.constexpr,
    TARGET: tl.constexpr,
    SEARCH: tl.constexpr,
    ROWS: tl.constexpr,
):
    first_row = tl.program_id(0).to(tl.int64) * ROWS
    # The entry of the program's first row: the last one whose first row is at most it. A
    # binary search over the table costs a few cached loads, once per program; a per-row table
    # would cost kernels and host time per bucket.
    lower = tl.zeros([], tl.int64)
    upper = tl.full([], 1 << SEARCH, tl.int64)
    for _ in tl.static_range(SEARCH):
        middle = (lower + upper) // 2
        right = tl.load(table + 5 * middle) <= first_row
        lower = tl.where(right, middle, lower)
        upper = tl.where(right, upper, middle)
    current = lower
    ELEMENTS: tl.constexpr = WORDS * PER_WORD
    column = tl.arange(0, WORDS)
    # The sums of the program's rows so far that belong to the output row `held`, added to it
    # with one atomic per sum when the rows move on to another tensor, and at the end.
    held = tl.load(table + 5 * current + 4)
    plain_sum = tl.zeros([], tl.int64)
    local_sum = tl.zeros([], tl.int64)
    for step in tl.static_range(ROWS):
        row = first_row + step
        if row < total:
            # Every entry has a row, so the next row is in this entry or the next one.
            current = tl.where(tl.load(table + 5 * (current + 1)) <= row, current + 1, current)
            entry = table + 5 * current
            within = row - tl.load(entry)
            source = tl.load(entry + 1).to(tl.pointer_type(SOURCE))
            target = tl.load(entry + 2)
            numel = tl.load(entry + 3)
            position = tl.load(entry + 4)
            index = within * ELEMENTS + tl.arange(0, ELEMENTS)
            kept = index < numel
            value = tl.load(source + index, mask=kept, other=0).to(TARGET)
            tl.store(target.to(tl.pointer_type(TARGET)) + index, value, mask=kept)
            # The row's words read back from where they were written, once every thread of the
            # program has written (the values' bytes, as the engine will hold them), masked past
            # the tensor's end as the digest kernel masks.
            tl.debug_barrier()
            valid = (numel - within * ELEMENTS) * (4 // PER_WORD)
            words = target.to(tl.pointer_type(tl.int32)) + within * WORDS + column
            word = tl.load(words, mask=4 * column < valid, other=0).to(tl.int64)
            if valid < 4 * WORDS:
                cut = tl.minimum(tl.maximum(valid - 4 * column, 0), 4)
                low = word & ((tl.full([WORDS], 1, tl.int64) << (8 * cut)) - 1)
                word = tl.where(cut == 4, word, low)
            plain = tl.sum(word, axis=0)
            local = tl.sum(word * (2 * column.to(tl.int64) + 1), axis=0)
            local += within * (2 * WORDS) * plain
            moved = position != held
            tl.atomic_add(out + 2 * held, plain_sum, mask=moved, sem="relaxed")
            tl.atomic_add(out + 2 * held + 1, local_sum, mask=moved, sem="relaxed")
            plain_sum = tl.where(moved, plain, plain_sum + plain)
            local_sum = tl.where(moved, local, local_sum + local)
            held = position
    # Relaxed: integer addition commutes, and nothing in the kernel reads the sums.
    tl.atomic_add(out + 2 * held, plain_sum, sem="relaxed")
    tl.atomic_add(out + 2 * held + 1, local_sum, sem="relaxed")


_TRITON_DTYPES = {
    torch.float32: tl.float32,
    torch.bfloat16: tl.bfloat16,
    torch.float16: tl.float16,
}
# Measured on an H200, fp32 into bf16, kernels alone on W1's and the 1.5B model's tensors:
# rows of 1024 words, 4 rows per program and 4 warps ran 0.63 and 2.44 ms, under the 0.77 and
# 2.74 ms of torch._foreach_copy_; the best of the variants that took each word from the
# registers as it was written (with no re-read) ran 0.75 and 2.86 ms. Adding each program's
# sums with atomics (per tensor its rows touch) instead of writing each row's sums for a second
# kernel to add up: 0.62 against 0.64 ms and 2.40 against 2.46 ms, in 256 MiB buckets.
COPY_WORDS = 1024
"""Words per row of the copy kernels (any length gives the same sums)."""
_ROWS_PER_PROGRAM = 4
_COPY_WARPS = 4
COPY_DTYPES = frozenset(_TRITON_DTYPES)
"""The source and target dtypes the copy kernels take."""


class PreparedCopy(NamedTuple):
    """A :class:`CopyTable` on the device, with what its launches need."""

    table: torch.Tensor
    rows: int
    search: int
    words: int
    per_word: int
    source: object  # the Triton dtypes
    target: object


def prepare_copy(table: CopyTable, device: torch.device) -> PreparedCopy:
    """The table of :func:`launch_copy` on ``device``. Every tensor in it was checked by the
    caller: contiguous, on ``device`` (CUDA), of the table's dtypes (both in
    :data:`COPY_DTYPES`), its target 4-byte aligned."""
    count = len(table.facts) // 5
    search = max(1, (count - 1).bit_length())
    host = array("q", table.facts)
    # Entries past the last start after every row: the search probes up to entry
    # 2**search - 1, the step to a row's next entry up to entry `count`.
    host.extend([1 << 62, 0, 0, 0, 0] * (max(1 << search, count + 1) - count))
    # Pinned and non-blocking: queued behind the kernels before it, no host sync. (An array
    # becomes a tensor without a Python step per value.)
    return PreparedCopy(
        table=to_device(torch.frombuffer(host, dtype=torch.int64), device),
        rows=table.rows,
        search=search,
        words=table.words,
        per_word=4 // table.target.itemsize,
        source=_TRITON_DTYPES[table.source],
        target=_TRITON_DTYPES[table.target],
    )


def launch_copy(prepared: PreparedCopy, out: torch.Tensor) -> None:
    """Copies each tensor of the table from its source to its target address (cast to the
    target dtype) and adds the fingerprint sums of the values written to ``out[position]``
    (``(k, 2)`` int64 on the table's device), in one kernel."""
    if not prepared.rows:
        return
    _copy_rows_kernel[(-(-prepared.rows // _ROWS_PER_PROGRAM),)](
        prepared.table,
        out,
        prepared.rows,
        WORDS=prepared.words,
        PER_WORD=prepared.per_word,
        SOURCE=prepared.source,
        TARGET=prepared.target,
        SEARCH=prepared.search,
        ROWS=_ROWS_PER_PROGRAM,
        num_warps=_COPY_WARPS,
    )
