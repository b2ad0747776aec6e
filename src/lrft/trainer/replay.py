"""The replay buffer: one iteration's experience on the CPU, handed out in shuffled micro-batches."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist

from lrft.dist import all_gather_objects
from lrft.trainer.experience import ExperienceBatch
from lrft.trainer.sequence_groups import concat_sequences, widened, widened_optional


class ReplayBuffer:
    """Holds experience on the host; :meth:`micro_batches` shuffles with a seeded generator.

    The order depends only on ``seed`` and the epoch, so a resumed run replays the same
    micro-batches. Every rank holds the same number of rows, so every rank runs the same number
    of (collective) forward passes. With a sequence-parallel ``group``, :meth:`append` gathers
    the group's experience: its ranks hold and hand out the same rows
    (:mod:`lrft.trainer.sequence_groups`).
    """

    def __init__(self, seed: int, group: dist.ProcessGroup | None = None) -> None:
        self._seed = seed
        self._group = group
        self._items: list[ExperienceBatch] = []

    def append(self, batch: ExperienceBatch) -> None:
        """Hold ``batch`` (with a group, the group's batches). Collective over the group."""
        if self._group is not None:
            batch = concat_experience(all_gather_objects(batch, self._group))
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


def concat_experience(parts: Sequence[ExperienceBatch]) -> ExperienceBatch:
    """``parts``' rows in order (per-token tensors padded to the longest response); the first
    part's metrics."""
    return ExperienceBatch(
        sequences=concat_sequences([part.sequences for part in parts]),
        old_logprobs=widened_optional([part.old_logprobs for part in parts]),
        ref_logprobs=widened_optional([part.ref_logprobs for part in parts]),
        scores=torch.cat([part.scores for part in parts]),
        advantages=widened([part.advantages for part in parts]),
        metrics=dict(parts[0].metrics),
        values=widened_optional([part.values for part in parts]),
        returns=widened_optional([part.returns for part in parts]),
        engine_logprobs=widened_optional([part.engine_logprobs for part in parts]),
    )
