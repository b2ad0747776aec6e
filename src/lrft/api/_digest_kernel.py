"""The row reduction of :mod:`lrft.api.digest` as one Triton kernel, for CUDA tensors.

One program per row: it reads the row's words once, masks the bytes past its tensor's end only
in a tensor's last row, and writes the row's plain and weighted sums (the weighted one already
shifted by the row's place in its tensor). Elementwise torch ops would widen every word to int64
in memory and reread it per sum, and a compiled function costs more host time per call than the
kernel takes on a bucket.
"""

from __future__ import annotations

import torch
import triton  # type: ignore[import-not-found, unused-ignore]  # CUDA builds of torch ship it; nothing else imports this
import triton.language as tl  # type: ignore[import-not-found, unused-ignore]  # as above


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
