""":class:`DigestBuffer`: tensors laid out in the rows of one buffer, so that their fingerprint
sums are one reduction over the buffer in place, with no staging copy."""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from typing import NamedTuple

import torch

from lrft.kernels._reduce import add_row_sums, uses_kernel
from lrft.kernels._replay import Replay
from lrft.kernels._rows import (
    ROW_BYTES,
    ROW_WORDS,
    Rows,
    contiguous_strides,
    row_groups,
    row_layout,
)


class DigestBuffer:
    """One device buffer holding tensors of the given shapes and dtypes at row-aligned
    offsets, for callers that write the tensors anyway (weight sync casts each bucket to the
    engine's dtype): :meth:`sums` fingerprints whatever :attr:`views` hold, with no staging copy.
    The bytes between the views are never read, so the buffer is not zeroed.

    ``pin_memory`` (host buffers only) page-locks the buffer, so that a whole-buffer copy to or
    from a CUDA device (:meth:`copy_from`) runs at full bandwidth.
    """

    def __init__(
        self,
        specs: Sequence[tuple[tuple[int, ...], torch.dtype]],
        device: torch.device | str,
        *,
        pin_memory: bool = False,
    ) -> None:
        self.specs: list[tuple[tuple[int, ...], torch.dtype]] = [
            (tuple(shape), dtype) for shape, dtype in specs
        ]
        self.device = torch.device(device)
        if pin_memory and self.device.type != "cpu":
            raise ValueError(
                f"DigestBuffer pin_memory needs a host buffer, got device {self.device}"
            )
        layout = buffer_layout(tuple(self.specs), self.device)
        self._words = torch.empty(
            (layout.rows, ROW_WORDS), dtype=torch.int32, device=self.device, pin_memory=pin_memory
        )
        flat = self._words.view(-1).view(torch.uint8)
        # One typed view of the whole buffer per dtype, then one as_strided per tensor: slicing
        # and two views per tensor cost several times more host time. 16 KiB row offsets
        # satisfy the alignment of every dtype.
        typed = {dtype: flat.view(dtype) for dtype in {dtype for _, dtype in self.specs}}
        self.views: list[torch.Tensor] = [
            typed[dtype].as_strided(shape, contiguous_strides(shape), start // dtype.itemsize)
            for (shape, dtype), start in zip(self.specs, layout.starts, strict=True)
        ]
        self._rows = layout.table
        self._sums: tuple[torch.Tensor, Replay] | None = None

    @property
    def nbytes(self) -> int:
        """Bytes the buffer occupies on its device, padding included."""
        return self._words.numel() * 4

    def copy_from(self, source: DigestBuffer) -> None:
        """Copies every tensor ``source`` holds into :attr:`views` as one copy of the whole
        buffer (padding included), from any device: ``source`` must hold the same specs, so
        its layout is this one's."""
        if source.specs != self.specs:
            raise ValueError(
                f"DigestBuffer.copy_from needs the same specs: this buffer holds "
                f"{len(self.specs)} tensors, the source {len(source.specs)}, and the first "
                f"differing spec is {_first_difference(self.specs, source.specs)}"
            )
        self._words.copy_(source._words)

    def sums(self) -> torch.Tensor:
        """The fingerprint sums of what :attr:`views` hold now, ``(len(views), 2)`` int64 on
        the buffer's device, without a host sync. An engine that keeps its weights in a buffer
        asks for these after every sync, so on CUDA the kernels are replayed from a graph from
        the second call on (its temporary, a thousandth of the buffer's size, stays allocated
        while the buffer lives)."""
        if self._sums is None:
            out = torch.empty((len(self.specs), 2), dtype=torch.int64, device=self.device)
            self._sums = (out, Replay(functools.partial(self._add_sums, out), self.device))
        out, replay = self._sums
        replay()
        return out.clone()

    def _add_sums(self, out: torch.Tensor) -> None:
        out.zero_()
        add_row_sums(self._words, self._rows, out)


def _first_difference(
    ours: Sequence[tuple[tuple[int, ...], torch.dtype]],
    theirs: Sequence[tuple[tuple[int, ...], torch.dtype]],
) -> str:
    for position, (mine, other) in enumerate(zip(ours, theirs, strict=False)):
        if mine != other:
            return f"at {position}: {mine} here, {other} in the source"
    return f"at {min(len(ours), len(theirs))}: one list ends there"


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
        table=row_layout(pieces, device, on_kernel=uses_kernel(device)),
    )
