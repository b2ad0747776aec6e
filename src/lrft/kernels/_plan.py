"""The fingerprint sums of any list of tensors, staged and reduced in rows: see
:mod:`lrft.kernels` for the layout and :mod:`lrft.api.digest` for the definition."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lrft.kernels._reduce import add_row_sums, uses_kernel
from lrft.kernels._rows import (
    ROW_BYTES,
    ROW_WORDS,
    STAGING_BYTES,
    Rows,
    device_of,
    row_groups,
    row_layout,
)


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
        capacity = staging_bytes // ROW_BYTES
        if capacity < 1:
            raise ValueError(
                f"staging_bytes {staging_bytes} is smaller than one row of {ROW_BYTES} bytes"
            )
        self.device = device_of(tensors)
        self.count = len(tensors)
        raw = [t.detach().contiguous().reshape(-1).view(torch.uint8) for t in tensors]
        groups = row_groups([r.numel() for r in raw], capacity)
        largest = max((group[-1].row + group[-1].rows for group in groups), default=0)
        self._staging = torch.empty(largest * ROW_BYTES, dtype=torch.uint8, device=self.device)
        self._groups: list[tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor], Rows]]
        self._groups = []
        on_kernel = uses_kernel(self.device)
        for pieces in groups:
            rows = pieces[-1].row + pieces[-1].rows
            buffer = self._staging[: rows * ROW_BYTES]
            targets = [buffer[p.row * ROW_BYTES : p.row * ROW_BYTES + p.nbytes] for p in pieces]
            sources = [
                raw[p.tensor][p.first_row * ROW_BYTES : p.first_row * ROW_BYTES + p.nbytes]
                for p in pieces
            ]
            rows_table = row_layout(pieces, self.device, on_kernel=on_kernel)
            self._groups.append((buffer, targets, sources, rows_table))

    def sums(self) -> torch.Tensor:
        """The fingerprint sums of what the tensors hold now, ``(count, 2)`` int64 on their
        device, without a host sync."""
        out = torch.zeros((self.count, 2), dtype=torch.int64, device=self.device)
        for buffer, targets, sources, rows in self._groups:
            torch._foreach_copy_(targets, sources)
            add_row_sums(buffer.view(torch.int32).view(-1, ROW_WORDS), rows, out)
        return out
