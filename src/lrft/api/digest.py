"""Per-tensor fingerprints that engines and trainers compute the same way, on any device.

Weight sync verifies an engine by comparing the fingerprint of each tensor the engine holds (read
back from its own parameters) with the fingerprint of the tensor the trainer sent. Hashing on the
host would copy every weight off the device, so the fingerprint is two wrapping 64-bit sums over
the tensor's bytes read as 32-bit words — a plain one and a position-weighted one — computed where
the tensor lives. Any single changed word changes the plain sum; moved or swapped words change
the weighted one. It detects corruption and stale weights; it is not a cryptographic hash.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch

_MASK = (1 << 64) - 1
# Bounded weights keep each product far below 2**63; only the running sums wrap.
_WEIGHT_PERIOD = 1 << 20
_CHUNK_WORDS = 1 << 24


def _words(tensor: torch.Tensor) -> torch.Tensor:
    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    pad = (-raw.numel()) % 4
    if pad:
        raw = torch.cat([raw, raw.new_zeros(pad)])
    return raw.view(torch.int32)


def tensor_digest(tensor: torch.Tensor) -> str:
    """Fingerprint of ``tensor``'s dtype, shape and bytes; equal on CPU and CUDA."""
    words = _words(tensor)
    plain = 0
    weighted = 0
    for start in range(0, words.numel(), _CHUNK_WORDS):
        chunk = words[start : start + _CHUNK_WORDS].to(torch.int64)
        positions = torch.arange(
            start, start + chunk.numel(), device=chunk.device, dtype=torch.int64
        )
        weights = (positions % _WEIGHT_PERIOD) * 2 + 1
        plain += int(chunk.sum().item())
        weighted += int((chunk * weights).sum().item())
    shape = "x".join(str(d) for d in tensor.shape)
    dtype = str(tensor.dtype).removeprefix("torch.")
    return f"{dtype}[{shape}]:{plain & _MASK:016x}{weighted & _MASK:016x}"


def combine_digests(digests: Mapping[str, str]) -> str:
    """One fingerprint for a whole set of named tensors, independent of iteration order."""
    h = hashlib.sha256()
    for name in sorted(digests):
        h.update(f"{name}={digests[name]}\n".encode())
    return h.hexdigest()[:32]
