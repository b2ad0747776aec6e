"""Per-tensor fingerprints that engines and trainers compute the same way, on any device.

Weight sync verifies an engine by comparing the fingerprint of each tensor the engine holds (read
back from its own parameters) with the fingerprint of the tensor the trainer sent. Hashing on the
host would copy every weight off the device, so the fingerprint is two wrapping 64-bit sums
computed where the tensor lives. It detects corruption and stale weights; it is not a
cryptographic hash.

Definition. The words ``w_p`` of a tensor are its bytes (contiguous, row-major, native
little-endian) read as signed 32-bit integers, the last word zero-padded; ``p`` counts words from
0. Then ``plain = sum(w_p) mod 2**64`` and ``weighted = sum((2p + 1) * w_p) mod 2**64``; both are
0 for an empty tensor. Any single changed word changes ``plain`` (its odd weight keeps the change
non-zero modulo ``2**64`` in ``weighted`` too); swapping words ``p`` and ``p'`` changes
``weighted`` by ``2 (p - p') (w_p' - w_p)``, never a multiple of ``2**64`` for different words
less than ``2**31`` words apart. The fingerprint string is ``"{dtype}[{dims}]:{plain:016x}{weighted:016x}"``.

Computation. A list of tensors costs a fixed number of kernels per group of up to
:data:`STAGING_BYTES`, however many tensors it holds: their bytes are copied (one fused copy) into
a buffer of rows of :data:`ROW_WORDS` words, each tensor starting on a row, and every row is
reduced at once. The bytes of a row past its tensor's end belong to no tensor and never count
(the CUDA kernel masks them, the eager path zeroes them before summing), so no buffer is zeroed
when it is made. On CUDA the reduction is one Triton kernel that reads each word once and produces both
sums of every row; elsewhere it runs eagerly. Each row's two sums are then added to its tensor's
entry (a row ``q`` rows into its tensor adds ``8192 q * plain_row`` to its weighted sum). The sums
are read back on the host only when :class:`PendingDigests` resolves them.

Writing and fingerprinting at once: :func:`copy_with_digest` (and :class:`CopyPlan`, for the
same tensors again and again) casts tensors into their targets and sums what it wrote, so that a
weight sync writing into an engine's storage needs no second pass to know what it sent. The
fingerprint strings are made in ``_digest_strings``, the staged fingerprints of any tensors in
``_digest_plan`` and the copy plans in ``_copy_plan``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

import torch

from lrft.api._copy_plan import CopyPlan as CopyPlan
from lrft.api._digest_plan import DigestPlan as DigestPlan
from lrft.api._digest_plan import digest_sums_many as digest_sums_many
from lrft.api._digest_rows import ROW_WORDS as ROW_WORDS
from lrft.api._digest_rows import STAGING_BYTES as STAGING_BYTES
from lrft.api._digest_rows import (
    add_row_sums,
    buffer_layout,
    contiguous_strides,
)
from lrft.api._digest_strings import CombinedDigest as CombinedDigest
from lrft.api._digest_strings import combine_digests as combine_digests
from lrft.api._digest_strings import format_digest as format_digest
from lrft.api._digest_strings import format_digests as format_digests
from lrft.api._replay import Replay


def copy_with_digest(
    sources: Sequence[torch.Tensor],
    targets: Sequence[torch.Tensor],
    positions: Sequence[int],
    out: torch.Tensor,
) -> None:
    """Copies each source into its target, cast to the target's dtype, and adds the fingerprint
    sums of the values written to ``out[position]`` (``out``: ``(k, 2)`` int64 on the targets'
    device, zero where nothing was added yet), without a host sync.

    This is how a weight sync writes straight into an engine's storage and still knows what it
    sent. On CUDA, contiguous floating-point tensors go through a Triton kernel (one launch per
    pair of dtypes) that casts and writes each row, then reads its words back and sums them into
    ``out`` with atomics: the copy's traffic and a re-read of what it wrote.
    Anything else is copied and then fingerprinted from the targets. :class:`CopyPlan` does
    the same for a list of tensors copied again and again.
    """
    CopyPlan(sources, targets, positions, out.device).run(sources, targets, out)


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


class _Batch(NamedTuple):
    names: list[str]
    headers: list[tuple[tuple[int, ...], torch.dtype]]
    sums: torch.Tensor


class PendingDigests:
    """Fingerprints queued on the device as tensors arrive, read back with one host sync per
    device. A tensor may be released or overwritten once it was added: only its sums are kept.
    A name added again takes its latest fingerprint."""

    def __init__(self) -> None:
        self._batches: list[_Batch] = []
        self._names: set[str] = set()

    def _push(
        self,
        names: list[str],
        headers: list[tuple[tuple[int, ...], torch.dtype]],
        sums: torch.Tensor,
    ) -> None:
        self._batches.append(_Batch(names, headers, sums))
        self._names.update(names)

    def add(self, name: str, tensor: torch.Tensor) -> None:
        self.add_many([(name, tensor)])

    def add_many(self, named: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Queues every tensor, a fixed number of kernels per device and staging group."""
        by_device: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
        for name, tensor in named:
            by_device.setdefault(tensor.device, []).append((name, tensor))
        for group in by_device.values():
            tensors = [tensor for _, tensor in group]
            self._push(
                [name for name, _ in group],
                [(tuple(t.shape), t.dtype) for t in tensors],
                digest_sums_many(tensors),
            )

    def add_buffer(self, names: Sequence[str], buffer: DigestBuffer) -> None:
        """Queues the tensors ``buffer`` holds now, named in the order of its views."""
        if len(names) != len(buffer.specs):
            raise ValueError(
                f"add_buffer got {len(names)} names for a buffer of {len(buffer.specs)} tensors"
            )
        self._push(list(names), list(buffer.specs), buffer.sums())

    def __len__(self) -> int:
        return len(self._names)

    def resolve(self) -> dict[str, str]:
        """Every fingerprint added, by name (one transfer per device)."""
        by_device: dict[torch.device, list[int]] = {}
        for position, batch in enumerate(self._batches):
            by_device.setdefault(batch.sums.device, []).append(position)
        values: dict[int, list[list[int]]] = {}
        for positions in by_device.values():
            rows = torch.cat([self._batches[p].sums for p in positions]).tolist()
            start = 0
            for p in positions:
                end = start + len(self._batches[p].names)
                values[p], start = rows[start:end], end
        result: dict[str, str] = {}
        for position, batch in enumerate(self._batches):
            for name, header, sums in zip(
                batch.names, batch.headers, values[position], strict=True
            ):
                result[name] = format_digest(*header, sums)
        return result


def tensor_digests(named: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """:func:`tensor_digest` of every tensor, a fixed number of kernels per staging group and
    one host transfer per device instead of work per tensor."""
    pending = PendingDigests()
    pending.add_many(named.items())
    return pending.resolve()


def tensor_digest(tensor: torch.Tensor) -> str:
    """Fingerprint of ``tensor``'s dtype, shape and bytes; equal on CPU and CUDA."""
    return tensor_digests({"": tensor})[""]
