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
"""

from __future__ import annotations

import functools
import hashlib
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple

import torch

ROW_WORDS = 4096
"""Words in one row of a staging buffer; every tensor starts at a row boundary."""
STAGING_BYTES = 64 << 20
"""The largest staging buffer :func:`digest_sums_many` allocates; larger inputs are split."""

_ROW_BYTES = ROW_WORDS * 4
# The eager reduction views a row as a (_SIDE, _SIDE) block: 2 * _SIDE weights instead of one per
# word.
_SIDE = 64
_MASK = (1 << 64) - 1
# The block's row and column weights, per device, made once.
_SIDE_WEIGHTS: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


class _Piece(NamedTuple):
    """``rows`` rows of tensor ``tensor``, from its row ``first_row``, staged at row ``row``;
    ``nbytes`` of them belong to the tensor."""

    tensor: int
    row: int
    first_row: int
    rows: int
    nbytes: int


class _Rows(NamedTuple):
    """What the reduction needs to know of each staged row, on the buffer's device."""

    tensor: torch.Tensor  # (rows,) the tensor the row belongs to
    offset: torch.Tensor  # (rows,) 2 * ROW_WORDS * q for the row's index q within its tensor
    valid: torch.Tensor  # (rows,) bytes of the row that belong to its tensor
    partial: torch.Tensor  # (m,) the rows with fewer than _ROW_BYTES valid bytes
    # (m, ROW_WORDS) int32 masks that keep only the valid bytes of each partial row, for the
    # eager reduction; empty where the device kernel masks as it reads
    tail_masks: torch.Tensor


def _rows_of(nbytes: int) -> int:
    return -(-nbytes // _ROW_BYTES)


def _side_weights(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    cached = _SIDE_WEIGHTS.get(device)
    if cached is None:
        side = torch.arange(_SIDE, dtype=torch.int64, device=device)
        cached = (side * (2 * _SIDE), side * 2 + 1)
        _SIDE_WEIGHTS[device] = cached
    return cached


def _to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type == "cuda":
        # A blocking copy from pageable memory waits for every kernel queued before it; a pinned
        # non-blocking one is only queued, so the digests stay free of host syncs.
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def _row_layout(pieces: Sequence[_Piece], device: torch.device) -> _Rows:
    """The rows of ``pieces`` (which cover rows 0, 1, ... in order), expanded on ``device`` from
    one small transfer of per-piece facts: per-row tables built on the host would cost more
    than the digest of a large bucket."""
    total = pieces[-1].row + pieces[-1].rows if pieces else 0
    partial = [p.row + p.rows - 1 for p in pieces if p.nbytes % _ROW_BYTES]
    facts = [value for p in pieces for value in (p.tensor, p.row, p.first_row, p.nbytes, p.rows)]
    moved = _to_device(torch.tensor(facts + partial, dtype=torch.int64), device)
    meta = moved[: len(facts)].view(-1, 5).t()
    counts = meta[4]

    def per_row(values: torch.Tensor) -> torch.Tensor:
        # output_size: the total is known here, so CUDA needs no host sync to size the result
        return torch.repeat_interleave(values, counts, output_size=total)

    within = torch.arange(total, dtype=torch.int64, device=device) - per_row(meta[1])
    valid = (per_row(meta[3]) - within * _ROW_BYTES).clamp(0, _ROW_BYTES)
    partial_rows = moved[len(facts) :]
    if device.type == "cuda" and _device_kernel() is not None:
        tail_masks = torch.empty((0, ROW_WORDS), dtype=torch.int32, device=device)
    else:
        column = torch.arange(ROW_WORDS, dtype=torch.int64, device=device)
        kept = (valid[partial_rows][:, None] - 4 * column).clamp(0, 4)
        # bytes kept per word -> the word's mask: 4 -> all bits (-1 as int32), 0 -> none
        tail_masks = (torch.bitwise_left_shift(torch.ones_like(kept), 8 * kept) - 1).to(torch.int32)
    return _Rows(
        tensor=per_row(meta[0]),
        offset=(within + per_row(meta[2])) * (2 * ROW_WORDS),
        valid=valid,
        partial=partial_rows,
        tail_masks=tail_masks,
    )


def _zero_tails(words: torch.Tensor, rows: _Rows) -> None:
    """Zeroes the bytes of each partial row past its tensor's end (padding, which no tensor
    view covers), so that whole-row sums count them as the definition's zero padding."""
    if rows.partial.numel():
        words[rows.partial] = words[rows.partial] & rows.tail_masks


@functools.cache
def _device_kernel() -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None:
    try:
        from lrft.api._digest_kernel import row_sums
    except ImportError:  # a torch build without Triton: the eager reduction, slower but equal
        return None
    return row_sums


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
    chunk = STAGING_BYTES // _ROW_BYTES
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


def _add_row_sums(words: torch.Tensor, rows: _Rows, out: torch.Tensor) -> None:
    """Adds the sums of each row of ``words`` (``(rows, ROW_WORDS)`` int32) to ``out[tensor]``
    (``(k, 2)`` int64) of the tensor ``rows`` names for it. Integer addition is exact and
    order-independent, so ``index_add_`` is deterministic on every device."""
    if words.shape[0] == 0:
        return
    kernel = _device_kernel() if words.is_cuda else None
    if kernel is not None:
        sums = kernel(words, rows.valid, rows.offset)
    else:
        _zero_tails(words, rows)
        plain, local = _unmasked_row_sums(words)
        sums = torch.stack([plain, torch.addcmul(local, rows.offset, plain)], dim=1)
    out.index_add_(0, rows.tensor, sums)


def _device_of(tensors: Sequence[torch.Tensor]) -> torch.device:
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


def _groups(sizes: Sequence[int], capacity: int) -> list[list[_Piece]]:
    """Row-aligned pieces of tensors of ``sizes`` bytes, in groups of at most ``capacity`` rows;
    a tensor that does not fit the rest of a group continues in the next one."""
    groups: list[list[_Piece]] = []
    pieces: list[_Piece] = []
    used = 0
    for tensor, nbytes in enumerate(sizes):
        rows = _rows_of(nbytes)
        done = 0
        while done < rows:
            if used == capacity:
                groups.append(pieces)
                pieces, used = [], 0
            take = min(rows - done, capacity - used)
            end = min(nbytes, (done + take) * _ROW_BYTES)
            pieces.append(_Piece(tensor, used, done, take, end - done * _ROW_BYTES))
            used += take
            done += take
    if pieces:
        groups.append(pieces)
    return groups


def digest_sums_many(
    tensors: Sequence[torch.Tensor], *, staging_bytes: int = STAGING_BYTES
) -> torch.Tensor:
    """The fingerprint sums ``(plain, weighted)`` of every tensor, as a ``(len(tensors), 2)``
    int64 tensor on their device (one device for all), without a host sync.

    The tensors are copied into a staging buffer of at most ``staging_bytes``; they may be
    released or overwritten as soon as this returns.
    """
    return DigestPlan(tensors, staging_bytes=staging_bytes).sums()


class DigestPlan:
    """The fingerprints of a fixed list of tensors, taken again and again: the staging layout,
    the byte views of every tensor and the row index are made once, so that each :meth:`sums`
    costs a fixed number of kernels per staging group and no work per tensor.

    The plan reads the tensors' storage as it was when the plan was made: a tensor whose data is
    replaced (``param.data = ...``) needs a new plan. It holds a staging buffer of up to
    ``staging_bytes`` on the tensors' device while it lives.
    """

    def __init__(
        self, tensors: Sequence[torch.Tensor], *, staging_bytes: int = STAGING_BYTES
    ) -> None:
        capacity = staging_bytes // _ROW_BYTES
        if capacity < 1:
            raise ValueError(
                f"staging_bytes {staging_bytes} is smaller than one row of {_ROW_BYTES} bytes"
            )
        self.device = _device_of(tensors)
        self.count = len(tensors)
        raw = [t.detach().contiguous().reshape(-1).view(torch.uint8) for t in tensors]
        groups = _groups([r.numel() for r in raw], capacity)
        largest = max((group[-1].row + group[-1].rows for group in groups), default=0)
        self._staging = torch.empty(largest * _ROW_BYTES, dtype=torch.uint8, device=self.device)
        self._groups: list[tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor], _Rows]]
        self._groups = []
        for pieces in groups:
            rows = pieces[-1].row + pieces[-1].rows
            buffer = self._staging[: rows * _ROW_BYTES]
            targets = [buffer[p.row * _ROW_BYTES : p.row * _ROW_BYTES + p.nbytes] for p in pieces]
            sources = [
                raw[p.tensor][p.first_row * _ROW_BYTES : p.first_row * _ROW_BYTES + p.nbytes]
                for p in pieces
            ]
            self._groups.append((buffer, targets, sources, _row_layout(pieces, self.device)))

    def sums(self) -> torch.Tensor:
        """The fingerprint sums of what the tensors hold now, ``(count, 2)`` int64 on their
        device, without a host sync."""
        out = torch.zeros((self.count, 2), dtype=torch.int64, device=self.device)
        for buffer, targets, sources, rows in self._groups:
            torch._foreach_copy_(targets, sources)
            _add_row_sums(buffer.view(torch.int32).view(-1, ROW_WORDS), rows, out)
        return out


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    step = 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


class _BufferLayout(NamedTuple):
    rows: int
    starts: list[int]  # each tensor's byte offset in the buffer
    table: _Rows


@functools.lru_cache(maxsize=256)
def _buffer_layout(
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
    groups = _groups(sizes, sys.maxsize)
    pieces = groups[0] if groups else []
    start = {p.tensor: p.row * _ROW_BYTES for p in pieces}
    return _BufferLayout(
        rows=pieces[-1].row + pieces[-1].rows if pieces else 0,
        starts=[start.get(i, 0) for i in range(len(specs))],
        table=_row_layout(pieces, device),
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
        layout = _buffer_layout(tuple(self.specs), self.device)
        self._words = torch.empty(
            (layout.rows, ROW_WORDS), dtype=torch.int32, device=self.device, pin_memory=pin_memory
        )
        flat = self._words.view(-1).view(torch.uint8)
        # One typed view of the whole buffer per dtype, then one as_strided per tensor: slicing
        # and two views per tensor cost several times more host time. 16 KiB row offsets
        # satisfy the alignment of every dtype.
        typed = {dtype: flat.view(dtype) for dtype in {dtype for _, dtype in self.specs}}
        self.views: list[torch.Tensor] = [
            typed[dtype].as_strided(shape, _contiguous_strides(shape), start // dtype.itemsize)
            for (shape, dtype), start in zip(self.specs, layout.starts, strict=True)
        ]
        self._rows = layout.table

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
        the buffer's device, without a host sync."""
        out = torch.zeros((len(self.specs), 2), dtype=torch.int64, device=self.device)
        _add_row_sums(self._words, self._rows, out)
        return out


def _first_difference(
    ours: Sequence[tuple[tuple[int, ...], torch.dtype]],
    theirs: Sequence[tuple[tuple[int, ...], torch.dtype]],
) -> str:
    for position, (mine, other) in enumerate(zip(ours, theirs, strict=False)):
        if mine != other:
            return f"at {position}: {mine} here, {other} in the source"
    return f"at {min(len(ours), len(theirs))}: one list ends there"


def format_digest(shape: Sequence[int], dtype: torch.dtype, sums: Sequence[int]) -> str:
    """The fingerprint string of a tensor of ``shape`` and ``dtype`` from its ``(plain,
    weighted)`` sums, read on the host."""
    plain, weighted = sums
    return f"{_header(tuple(shape), dtype)}:{plain & _MASK:016x}{weighted & _MASK:016x}"


@functools.lru_cache(maxsize=4096)
def _header(shape: tuple[int, ...], dtype: torch.dtype) -> str:
    # A model has few distinct (shape, dtype) pairs, formatted for every tensor of every sync.
    dims = "x".join(str(d) for d in shape)
    return f"{str(dtype).removeprefix('torch.')}[{dims}]"


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


def combine_digests(digests: Mapping[str, str]) -> str:
    """One fingerprint for a whole set of named tensors, independent of iteration order."""
    h = hashlib.sha256()
    for name in sorted(digests):
        h.update(f"{name}={digests[name]}\n".encode())
    return h.hexdigest()[:32]
