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
from collections.abc import Mapping, Sequence

import torch

_MASK = (1 << 64) - 1
# Bounded weights keep each product far below 2**63; only the running sums wrap.
_WEIGHT_PERIOD = 1 << 20
# The position weights of one period, per device (8 MiB each), made once.
_WEIGHTS: dict[torch.device, torch.Tensor] = {}


def _words(tensor: torch.Tensor) -> torch.Tensor:
    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    pad = (-raw.numel()) % 4
    if pad:
        raw = torch.cat([raw, raw.new_zeros(pad)])
    return raw.view(torch.int32)


def _weights(length: int, device: torch.device) -> torch.Tensor:
    """``2 * position + 1`` for the first ``length`` positions of a period, on ``device``."""
    cached = _WEIGHTS.get(device)
    if cached is None:
        cached = torch.arange(_WEIGHT_PERIOD, device=device, dtype=torch.int64) * 2 + 1
        _WEIGHTS[device] = cached
    return cached[:length]


def digest_sums(tensor: torch.Tensor) -> torch.Tensor:
    """The fingerprint's sums as three int64 on ``tensor``'s device, without a host sync:
    the plain sum, and the weighted sum split as ``low + 2**32 * high`` (:func:`format_digest`
    joins them on the host).

    Position ``p``'s weight depends only on ``p mod 2**20``, so the words are summed down the
    columns of a ``(-1, 2**20)`` view first (one pass over the tensor) and weighted once per
    column; each column sum is split into 32-bit halves so that no product overflows.
    """
    words = _words(tensor)
    count = words.numel()
    full = count - count % _WEIGHT_PERIOD
    if full == 0:
        columns = words.to(torch.int64)
    else:
        columns = words[:full].view(-1, _WEIGHT_PERIOD).sum(0, dtype=torch.int64)
        tail = words[full:]
        if tail.numel():
            columns[: tail.numel()] += tail
    weights = _weights(columns.numel(), columns.device)
    low = (columns & 0xFFFFFFFF) * weights
    high = (columns >> 32) * weights
    return torch.stack([columns.sum(), low.sum(), high.sum()])


def format_digest(shape: Sequence[int], dtype: torch.dtype, sums: Sequence[int]) -> str:
    """The fingerprint string of a tensor of ``shape`` and ``dtype`` from its
    :func:`digest_sums`, read on the host."""
    plain, low, high = sums
    weighted = low + (high << 32)
    dims = "x".join(str(d) for d in shape)
    name = str(dtype).removeprefix("torch.")
    return f"{name}[{dims}]:{plain & _MASK:016x}{weighted & _MASK:016x}"


class PendingDigests:
    """Fingerprints queued on the device as tensors arrive, read back with one host sync.

    A tensor may be released or overwritten once it was added: only its sums are kept.
    """

    def __init__(self) -> None:
        self._headers: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
        self._sums: dict[str, torch.Tensor] = {}

    def add(self, name: str, tensor: torch.Tensor) -> None:
        self._headers[name] = (tuple(tensor.shape), tensor.dtype)
        self._sums[name] = digest_sums(tensor)

    def __len__(self) -> int:
        return len(self._sums)

    def resolve(self) -> dict[str, str]:
        """Every fingerprint added, by name (one transfer per device)."""
        by_device: dict[torch.device, list[str]] = {}
        for name, sums in self._sums.items():
            by_device.setdefault(sums.device, []).append(name)
        result: dict[str, str] = {}
        for names in by_device.values():
            values = torch.stack([self._sums[name] for name in names]).tolist()
            for name, sums in zip(names, values, strict=True):
                result[name] = format_digest(*self._headers[name], sums)
        return result


def tensor_digests(named: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """:func:`tensor_digest` of every tensor, with one host sync per device instead of one each."""
    pending = PendingDigests()
    for name, tensor in named.items():
        pending.add(name, tensor)
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
