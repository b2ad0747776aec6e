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
less than ``2**31`` words apart. The fingerprint string is
``"{dtype}[{dims}]:{plain:016x}{weighted:016x}"``.

This module holds the definition and a plain implementation of it (:func:`digest_sums`, a few
eager torch operations per tensor, on the tensors' own device), which any engine may use for its
``weights_digest``. An implementation that computes the same sums faster (an engine that keeps
its weights laid out for one fused reduction, a sync that fingerprints what it writes as it
writes it) must give the same sums; the strings are made from sums by :func:`format_digests`.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from typing import Protocol

import torch

_MASK = (1 << 64) - 1
# Words summed per step: bounds the int64 temporaries to a few times 32 MiB, whatever the tensor.
_CHUNK_WORDS = 1 << 22


class HasShapeAndDtype(Protocol):
    """What a fingerprint string names of a tensor (a tensor or a ``TensorSpec``)."""

    @property
    def shape(self) -> Sequence[int]: ...

    @property
    def dtype(self) -> torch.dtype: ...


def digest_sums(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The sums ``(plain, weighted)`` of every tensor, as a ``(len(tensors), 2)`` int64 tensor on
    their device (one device for all; the CPU when there are none), without a host sync.

    int64 products and sums wrap in two's complement: that is the definition's arithmetic
    modulo ``2**64``, not an overflow to avoid.
    """
    device = tensors[0].device if tensors else torch.device("cpu")
    for position, tensor in enumerate(tensors):
        if tensor.device != device:
            raise ValueError(
                f"digest_sums needs every tensor on one device: tensor 0 is on {device}, "
                f"tensor {position} on {tensor.device}"
            )
    out = torch.zeros((len(tensors), 2), dtype=torch.int64, device=device)
    for row, tensor in enumerate(tensors):
        raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        for start in range(0, raw.numel(), 4 * _CHUNK_WORDS):
            words = _words(raw[start : start + 4 * _CHUNK_WORDS])
            first = start // 4
            weights = torch.arange(
                2 * first + 1, 2 * (first + words.numel()), 2, dtype=torch.int64, device=device
            )
            out[row, 0] += words.sum()
            out[row, 1] += (words * weights).sum()
    return out


def _words(raw: torch.Tensor) -> torch.Tensor:
    """``raw`` bytes as int64 words, the last one zero-padded. The bytes are copied into a new
    buffer: a view of them may start off a 4-byte boundary, which an int32 view refuses."""
    padded = torch.zeros(-(-raw.numel() // 4) * 4, dtype=torch.uint8, device=raw.device)
    padded[: raw.numel()] = raw
    return padded.view(torch.int32).to(torch.int64)


def format_digest(shape: Sequence[int], dtype: torch.dtype, sums: Sequence[int]) -> str:
    """The fingerprint string of a tensor of ``shape`` and ``dtype`` from its ``(plain,
    weighted)`` sums, read on the host."""
    plain, weighted = sums
    return f"{digest_header(tuple(shape), dtype)}:{plain & _MASK:016x}{weighted & _MASK:016x}"


def format_digests(
    names: Sequence[str], specs: Sequence[HasShapeAndDtype], sums: torch.Tensor
) -> dict[str, str]:
    """The fingerprint strings of tensors named ``names``, of the shapes and dtypes ``specs``
    give, from their ``(len(names), 2)`` sums (one transfer to the host)."""
    # Both sums of every tensor as big-endian bytes, in hex at once: 32 digits per tensor,
    # each sum's digits modulo 2**64 as the definition formats them.
    digits = sums.to("cpu").numpy().astype(">i8").tobytes().hex()
    return {
        name: f"{digest_header(tuple(spec.shape), spec.dtype)}:{digits[32 * i : 32 * i + 32]}"
        for i, (name, spec) in enumerate(zip(names, specs, strict=True))
    }


@functools.lru_cache(maxsize=4096)
def digest_header(shape: tuple[int, ...], dtype: torch.dtype) -> str:
    """The part of a fingerprint string before its sums: ``"{dtype}[{dims}]"``."""
    # A model has few distinct (shape, dtype) pairs, formatted for every tensor of every sync.
    dims = "x".join(str(d) for d in shape)
    return f"{str(dtype).removeprefix('torch.')}[{dims}]"


def combine_digests(digests: Mapping[str, str]) -> str:
    """One fingerprint for a whole set of named tensors, independent of iteration order."""
    h = hashlib.sha256()
    for name in sorted(digests):
        h.update(f"{name}={digests[name]}\n".encode())
    return h.hexdigest()[:32]


def tensor_digests(named: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """:func:`tensor_digest` of every tensor, with one host transfer per device."""
    by_device: dict[torch.device, list[str]] = {}
    for name, tensor in named.items():
        by_device.setdefault(tensor.device, []).append(name)
    digests: dict[str, str] = {}
    for names in by_device.values():
        tensors = [named[name] for name in names]
        digests.update(format_digests(names, tensors, digest_sums(tensors)))
    return {name: digests[name] for name in named}


def tensor_digest(tensor: torch.Tensor) -> str:
    """Fingerprint of ``tensor``'s dtype, shape and bytes; equal on CPU and CUDA."""
    return tensor_digests({"": tensor})[""]
