"""The row reduction: the sums of every row of a staging or digest buffer added to their
tensors' entries. On CUDA it is the Triton kernels of ``_triton_rows``; elsewhere, or in a torch
build without Triton, it runs eagerly and gives the same sums."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from lrft.kernels._rows import ROW_BYTES, STAGING_BYTES, Rows

# The eager reduction views a row as a (_SIDE, _SIDE) block: 2 * _SIDE weights instead of one per
# word.
_SIDE = 64
# The block's row and column weights, per device, made once.
_SIDE_WEIGHTS: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


@functools.cache
def device_kernel() -> (
    Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None] | None
):
    try:
        from lrft.kernels._triton_rows import add_row_sums
    except ImportError:  # a torch build without Triton: the eager reduction, slower but equal
        return None
    return add_row_sums


def uses_kernel(device: torch.device) -> bool:
    """Whether rows on ``device`` are reduced by the device kernels (which read other tables
    than the eager reduction: ``row_layout(on_kernel=...)``)."""
    return device.type == "cuda" and device_kernel() is not None


def _side_weights(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    cached = _SIDE_WEIGHTS.get(device)
    if cached is None:
        side = torch.arange(_SIDE, dtype=torch.int64, device=device)
        cached = (side * (2 * _SIDE), side * 2 + 1)
        _SIDE_WEIGHTS[device] = cached
    return cached


def _zero_tails(words: torch.Tensor, rows: Rows) -> None:
    """Zeroes the bytes of each partial row past its tensor's end (padding, which no tensor
    view covers), so that whole-row sums count them as the definition's zero padding."""
    if rows.partial.numel():
        words[rows.partial] = words[rows.partial] & rows.tail_masks


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
