"""What ``BroadcastSync`` puts on the span group: bucket headers, the bytes of each bucket packed
into one buffer, the end of a stream, and what each rollout rank reports back.

A bucket travels as its header (names, shapes, dtypes, byte offsets; an object broadcast) and
then one flat ``uint8`` buffer holding every tensor's bytes, each at an offset aligned for any
dtype, so the receiver reads each tensor as a view of the buffer without a copy.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

_ALIGN = 16
"""Byte alignment of each tensor in a bucket's buffer: a view of it as any dtype is aligned."""


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in a bucket header")
    return dtype


@attrs.frozen(kw_only=True)
class BucketHeader:
    """One bucket: each tensor's name, shape, dtype and byte offset, and the buffer's size."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    offsets: tuple[int, ...]
    nbytes: int


@attrs.frozen(kw_only=True)
class StreamEnd:
    """The end of a sync's stream: the sent tensors' digests (``None`` unverified) and, when
    the sender failed, why (the receivers then leave their engines stale)."""

    digests: dict[str, str] | None
    error: str | None


@attrs.frozen(kw_only=True)
class Received:
    """What a rollout rank reports after a sync: the version its engine serves now (``None``:
    stale), the combined digest of what it holds (when verified), and its error if it failed."""

    rank: int
    version: int | None
    digest: str
    error: str | None


def _aligned(size: int) -> int:
    return -(-size // _ALIGN) * _ALIGN


def pack(
    names: Sequence[str], tensors: Sequence[torch.Tensor], device: torch.device
) -> tuple[BucketHeader, torch.Tensor]:
    """The header of a bucket and its bytes in one buffer on ``device``."""
    offsets, position = [], 0
    for tensor in tensors:
        offsets.append(position)
        position = _aligned(position + tensor.numel() * tensor.element_size())
    buffer = torch.zeros(position, dtype=torch.uint8, device=device)
    for tensor, offset in zip(tensors, offsets, strict=True):
        raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        buffer[offset : offset + raw.numel()].copy_(raw)
    header = BucketHeader(
        names=tuple(names),
        shapes=tuple(tuple(tensor.shape) for tensor in tensors),
        dtypes=tuple(_dtype_name(tensor.dtype) for tensor in tensors),
        offsets=tuple(offsets),
        nbytes=position,
    )
    return header, buffer


def unpack(header: BucketHeader, buffer: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """The bucket's named tensors, as views of ``buffer``."""
    if buffer.numel() != header.nbytes:
        raise ValueError(f"a bucket of {header.nbytes} bytes arrived as {buffer.numel()} bytes")
    named = []
    for name, shape, dtype_name, offset in zip(
        header.names, header.shapes, header.dtypes, header.offsets, strict=True
    ):
        dtype = _dtype(dtype_name)
        count = 1
        for size in shape:
            count *= size
        raw = buffer[offset : offset + count * dtype.itemsize]
        named.append((name, raw.view(dtype).reshape(shape)))
    return named
