"""The replay buffer: one iteration's experience on the CPU, handed out in shuffled micro-batches."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from lrft.trainer.experience import ExperienceBatch


class ReplayBuffer:
    """Holds experience on the host; :meth:`micro_batches` shuffles with a seeded generator.

    The order depends only on ``seed`` and the epoch, so a resumed run replays the same
    micro-batches. Every rank holds the same number of rows, so every rank runs the same number
    of (collective) forward passes.
    """

    def __init__(self, seed: int) -> None:
        self._seed = seed
        self._items: list[ExperienceBatch] = []

    def append(self, batch: ExperienceBatch) -> None:
        self._items.append(batch)

    def clear(self) -> None:
        self._items.clear()

    def __len__(self) -> int:
        return sum(len(item) for item in self._items)

    def micro_batches(self, size: int, *, epoch: int) -> Iterator[ExperienceBatch]:
        """All rows once, in a shuffled order, ``size`` rows at a time (the last may be short)."""
        for rows in self.row_groups(size, epoch=epoch):
            yield self.select(rows)

    def row_groups(self, size: int, *, epoch: int) -> list[torch.Tensor]:
        """The row indices of :meth:`micro_batches`, in the same order."""
        batch = self._batch()
        generator = torch.Generator().manual_seed(self._seed * 1_000_003 + epoch)
        order = torch.randperm(len(batch), generator=generator)
        return [order[start : start + size] for start in range(0, len(batch), size)]

    def select(self, rows: torch.Tensor) -> ExperienceBatch:
        """Rows ``rows`` of the held batch, trimmed to their longest sequence and response."""
        return self._batch().select(rows)

    def row_lengths(self) -> torch.Tensor:
        """(B,): what each row costs a forward, in tokens: its real (unpadded) tokens, image
        placeholders included, plus its media encoder's inputs (a vision tower's patches)."""
        sequences = self._batch().sequences
        return sequences.attention_mask.sum(-1) + sequences.media_patches()

    def _batch(self) -> ExperienceBatch:
        if len(self._items) != 1:
            raise ValueError(f"the buffer holds {len(self._items)} batches; append exactly one")
        return self._items[0]
