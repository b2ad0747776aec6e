"""The direct sync's digests: the fingerprints of what it sent, queued on the device as the
buckets pass (:class:`PendingDigests`), and the report's combined digest of a fixed list of
tensors from their sums (:class:`CombinedDigest`)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np
import torch

from lrft.api.digest import HasShapeAndDtype, digest_header, format_digest
from lrft.kernels import DigestBuffer, digest_sums_many

_DIGITS = 32  # hex digits of a tensor's two sums


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


class CombinedDigest:
    """``combine_digests(format_digests(names, specs, sums))`` for fixed names and specs, with
    the text of every line but the sums laid out once: a weight sync reports the combined
    digest of the same tensors after every sync, and filling the sums' digits into the prepared
    text costs a few array operations, not a string per tensor."""

    def __init__(self, names: Sequence[str], specs: Sequence[HasShapeAndDtype]) -> None:
        order = sorted(range(len(names)), key=names.__getitem__)
        self._order = np.array(order, dtype=np.int64)
        text = bytearray()
        starts = []
        for i in order:
            text += f"{names[i]}={digest_header(tuple(specs[i].shape), specs[i].dtype)}:".encode()
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
