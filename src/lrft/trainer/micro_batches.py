"""Micro-batches by token budget: rows packed so that each forward holds at most a given number
of (padded) tokens, with the loss of the fixed micro-batches unchanged.

With ``micro_train_batch_size`` rows per micro-batch, one long response makes its whole
micro-batch wide, and a batch of short ones leaves the device idle. Packing by tokens fixes
both: the rows of one optimizer step are sorted by length and placed first-fit into
micro-batches whose padded size (rows x longest row) stays within the budget, or, when the
forwards pack their rows end to end (``--packing_samples``), whose tokens do.

The loss does not change. The fixed micro-batches (``micro_train_batch_size`` shuffled rows)
still define how losses are aggregated: each one's loss is a sum of per-row terms divided by a
count over its rows (:func:`lrft.algo.aggregation_divisor`). A packed micro-batch computes, for
each fixed micro-batch it holds rows of, the loss of those rows scaled by their share of that
count; the parts of a fixed micro-batch add up to its loss, so the gradient of the step is the
one of the fixed path (up to floating-point summation order).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import attrs
import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)


def pack_by_tokens(lengths: Sequence[int], budget: int, *, packed: bool = False) -> list[list[int]]:
    """Indices of ``lengths``, grouped so that each group's cost stays within ``budget``: its
    padded size ``len(group) * max(lengths[group])``, or with ``packed`` (rows laid end to end,
    :mod:`lrft.trainer.packing`) its tokens ``sum(lengths[group])``.

    First-fit on the rows sorted longest first (ties by index, so the plan is deterministic).
    A row longer than ``budget`` makes a micro-batch of its own.
    """
    if budget < 1:
        raise ValueError(f"budget must be >= 1 token, got {budget}")
    order = sorted(range(len(lengths)), key=lambda index: (-lengths[index], index))
    groups: list[list[int]] = []
    widths: list[int] = []  # each group's first (longest) row
    totals: list[int] = []  # each group's tokens
    for index in order:
        for slot, group in enumerate(groups):
            cost = totals[slot] + lengths[index] if packed else (len(group) + 1) * widths[slot]
            if cost <= budget:
                group.append(index)
                totals[slot] += lengths[index]
                break
        else:
            if lengths[index] > budget:
                logger.warning(
                    "a sequence of %d tokens exceeds max_tokens_per_micro_batch=%d: it forms a "
                    "micro-batch of its own",
                    lengths[index],
                    budget,
                )
            groups.append([index])
            widths.append(lengths[index])
            totals.append(lengths[index])
    return groups


@attrs.frozen(kw_only=True)
class PackedPart:
    """The rows of one fixed micro-batch (``group``) that a packed micro-batch holds."""

    group: int
    rows: tuple[int, ...]  # positions in the packed micro-batch


@attrs.frozen(kw_only=True)
class PackedMicroBatch:
    """Buffer rows of one forward, and which fixed micro-batch each run of them belongs to.

    ``parts`` is empty for a padding micro-batch: a forward every rank must make (the forwards
    are collective) whose loss is multiplied by 0.
    """

    buffer_rows: torch.Tensor
    parts: tuple[PackedPart, ...]


def plan_step(
    groups: Sequence[torch.Tensor], lengths: torch.Tensor, budget: int, *, packed: bool = False
) -> list[PackedMicroBatch]:
    """The packed micro-batches of one optimizer step over the fixed ``groups`` (buffer row
    indices); ``lengths`` holds every buffer row's token count; ``packed``: the forwards lay
    their rows end to end (:func:`pack_by_tokens`)."""
    owners: list[tuple[int, int]] = [
        (group, int(row)) for group, rows in enumerate(groups) for row in rows.tolist()
    ]
    plan = pack_by_tokens([int(lengths[row]) for _, row in owners], budget, packed=packed)
    micro_batches = []
    for members in plan:
        members = sorted(members)  # keep each fixed micro-batch's rows together, in its order
        parts: dict[int, list[int]] = {}
        for position, member in enumerate(members):
            parts.setdefault(owners[member][0], []).append(position)
        micro_batches.append(
            PackedMicroBatch(
                buffer_rows=torch.tensor([owners[member][1] for member in members]),
                parts=tuple(
                    PackedPart(group=group, rows=tuple(rows)) for group, rows in parts.items()
                ),
            )
        )
    return micro_batches


def equalize_across_ranks(
    plan: list[PackedMicroBatch], device: torch.device
) -> list[PackedMicroBatch]:
    """``plan`` padded to the longest plan of any rank with zero-loss micro-batches of one row,
    so that every rank makes the same number of (collective) forwards and backwards."""
    if not plan or not dist.is_initialized() or dist.get_world_size() == 1:
        return plan
    count = torch.tensor([len(plan)], device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    shortest = min(plan, key=lambda micro: len(micro.buffer_rows))
    filler = PackedMicroBatch(buffer_rows=shortest.buffer_rows[:1], parts=())
    return plan + [filler] * (int(count) - len(plan))


def packed_passes(
    groups: Sequence[torch.Tensor],
    lengths: torch.Tensor,
    budget: int,
    device: torch.device,
    *,
    packed: bool = False,
) -> list[PackedMicroBatch]:
    """One optimizer step's forwards over the fixed ``groups`` (buffer rows whose token counts
    are ``lengths``: :meth:`~lrft.trainer.replay.ReplayBuffer.row_lengths`), packed within
    ``budget`` tokens (padded or, with ``packed``, laid end to end) and padded to as many as any
    rank makes. Collective."""
    plan = plan_step(groups, lengths, budget, packed=packed)
    return equalize_across_ranks(plan, device)
