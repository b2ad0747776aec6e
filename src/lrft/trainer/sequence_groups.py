"""The rows a sequence-parallel group runs its forwards on: every rank's own, gathered in
group-rank order.

Each rank rolls out and scores its own share of the prompts, and computes its own advantages
(with statistics over every rank, as without sequence parallelism); the ranks of a
sequence-parallel group then run their forwards and updates on the union of their rows, each on
its own part of every packed row (:mod:`lrft.trainer.packing`). The union is the same tensors on
every rank of the group, so the ranks make the same forwards in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from lrft.dist import all_gather_objects
from lrft.trainer.sequences import Sequences


def widened(tensors: Sequence[Tensor]) -> Tensor:
    """``tensors`` (rows, columns, ...) right-padded with zeros to the widest, concatenated."""
    width = max(t.shape[1] for t in tensors)
    return torch.cat([F.pad(t, (0, 0) * (t.dim() - 2) + (0, width - t.shape[1])) for t in tensors])


def widened_optional(tensors: Sequence[Tensor | None]) -> Tensor | None:
    """:func:`widened` of ``tensors`` (1-D ones concatenated), or ``None`` when all are."""
    present = [t for t in tensors if t is not None]
    if not present:
        return None
    if len(present) != len(tensors):
        raise ValueError("some ranks' rows carry a tensor that others lack")
    return widened(present) if present[0].dim() > 1 else torch.cat(present)


def concat_sequences(parts: Sequence[Sequences]) -> Sequences:
    """``parts``' rows in order, padded to the widest sequence and response."""
    with_media = any(part.media for part in parts)
    lengths = [part.response_lengths for part in parts]
    if any(length is not None for length in lengths):
        # a part without holes in its action mask: its responses are its action tokens
        lengths = [
            part.action_mask.sum(-1) if length is None else length
            for part, length in zip(parts, lengths, strict=True)
        ]
    return Sequences(
        input_ids=widened([part.input_ids for part in parts]),
        attention_mask=widened([part.attention_mask for part in parts]),
        prompt_lengths=torch.cat([part.prompt_lengths for part in parts]),
        action_mask=widened([part.action_mask for part in parts]),
        action_tokens=widened([part.action_tokens for part in parts]),
        media=[m for part in parts for m in (part.media or [None] * len(part))]
        if with_media
        else (),
        response_lengths=widened_optional(lengths),
    )


def gather_sequences(sequences: Sequences, group: dist.ProcessGroup) -> tuple[Sequences, Tensor]:
    """The group's rows in group-rank order, and which of them are this rank's own. Collective
    over ``group``."""
    parts = all_gather_objects(sequences, group)
    before = sum(len(part) for part in parts[: dist.get_rank(group)])
    return concat_sequences(parts), torch.arange(before, before + len(sequences))
