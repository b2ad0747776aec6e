"""The fingerprint strings of :mod:`lrft.api.digest`: one tensor's, many tensors' from their
sums at once, and one string for a whole named set. See that module for the definition."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np
import torch

_MASK = (1 << 64) - 1
_DIGITS = 32  # hex digits of a tensor's two sums


class _HasShapeAndDtype(Protocol):
    @property
    def shape(self) -> Sequence[int]: ...

    @property
    def dtype(self) -> torch.dtype: ...


def format_digest(shape: Sequence[int], dtype: torch.dtype, sums: Sequence[int]) -> str:
    """The fingerprint string of a tensor of ``shape`` and ``dtype`` from its ``(plain,
    weighted)`` sums, read on the host."""
    plain, weighted = sums
    return f"{_header(tuple(shape), dtype)}:{plain & _MASK:016x}{weighted & _MASK:016x}"


def format_digests(
    names: Sequence[str], specs: Sequence[_HasShapeAndDtype], sums: torch.Tensor
) -> dict[str, str]:
    """The fingerprint strings of tensors named ``names``, of the shapes and dtypes ``specs``
    give, from their ``(len(names), 2)`` sums (one transfer to the host)."""
    # Both sums of every tensor as big-endian bytes, in hex at once: 32 digits per tensor,
    # each sum's digits modulo 2**64 as the definition formats them.
    digits = sums.to("cpu").numpy().astype(">i8").tobytes().hex()
    return {
        name: f"{_header(tuple(spec.shape), spec.dtype)}:{digits[32 * i : 32 * i + 32]}"
        for i, (name, spec) in enumerate(zip(names, specs, strict=True))
    }


class CombinedDigest:
    """``combine_digests(format_digests(names, specs, sums))`` for fixed names and specs, with
    the text of every line but the sums laid out once: a weight sync reports the combined
    digest of the same tensors after every sync, and filling the sums' digits into the prepared
    text costs a few array operations, not a string per tensor."""

    def __init__(self, names: Sequence[str], specs: Sequence[_HasShapeAndDtype]) -> None:
        order = sorted(range(len(names)), key=names.__getitem__)
        self._order = np.array(order, dtype=np.int64)
        text = bytearray()
        starts = []
        for i in order:
            text += f"{names[i]}={_header(tuple(specs[i].shape), specs[i].dtype)}:".encode()
            starts.append(len(text))
            text += b"0" * _DIGITS + b"\n"
        self._text = np.frombuffer(bytes(text), dtype=np.uint8)
        # where each digit of the sums, in sorted-name order, goes in the text
        self._digit_at = (np.array(starts, dtype=np.int64)[:, None] + np.arange(_DIGITS)).ravel()

    def of(self, sums: torch.Tensor) -> str:
        """The combined digest of tensors whose ``(len(names), 2)`` sums are ``sums``."""
        rows = sums.to("cpu").numpy()[self._order]
        digits = np.frombuffer(rows.astype(">i8").tobytes().hex().encode(), dtype=np.uint8)
        text = self._text.copy()
        text[self._digit_at] = digits
        return hashlib.sha256(text.tobytes()).hexdigest()[:32]


@functools.lru_cache(maxsize=4096)
def _header(shape: tuple[int, ...], dtype: torch.dtype) -> str:
    # A model has few distinct (shape, dtype) pairs, formatted for every tensor of every sync.
    dims = "x".join(str(d) for d in shape)
    return f"{str(dtype).removeprefix('torch.')}[{dims}]"


def combine_digests(digests: Mapping[str, str]) -> str:
    """One fingerprint for a whole set of named tensors, independent of iteration order."""
    h = hashlib.sha256()
    for name in sorted(digests):
        h.update(f"{name}={digests[name]}\n".encode())
    return h.hexdigest()[:32]
