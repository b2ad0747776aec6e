"""The gradient-free passes over a rank's rollout (the actor's old logprobs, the reference's
logprobs, the critic's values): which rows each forward holds, in the trainer's layout.

Padded, or packed without a budget: ``micro_batch_size`` consecutive rows per forward, as
before packing. Packed with ``max_tokens`` (``--max_tokens_per_micro_batch``): rows packed
first-fit into rows of at most that many tokens, and every rank then makes as many forwards as
the rank that needs the most (the forwards are collective), the extra ones over one row whose
output is dropped. With a sequence-parallel group, the passes run over the group's rows
(:mod:`lrft.trainer.sequence_groups`) and each rank keeps its own.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor

from lrft.trainer.micro_batches import pack_by_tokens
from lrft.trainer.packing import TokenLayout
from lrft.trainer.sequence_groups import gather_sequences
from lrft.trainer.sequences import Sequences

Forward = Callable[[Sequences], Tensor]
"""A micro-batch's (rows, steps) output, on any device."""


def pass_rows(
    sequences: Sequences,
    *,
    micro_batch_size: int,
    layout: TokenLayout,
    max_tokens: int | None,
    device: torch.device,
) -> list[Tensor | None]:
    """The rows of each forward, ``None`` for a forward made only to match the other ranks'
    count. Collective (the count) when the rows are packed by tokens."""
    rows = len(sequences)
    if not layout.packed or max_tokens is None:
        return [
            torch.arange(start, min(start + micro_batch_size, rows))
            for start in range(0, rows, micro_batch_size)
        ]
    lengths = (sequences.attention_mask.sum(-1) + sequences.media_patches()).tolist()
    plan: list[Tensor | None] = [
        torch.tensor(sorted(group)) for group in pack_by_tokens(lengths, max_tokens, packed=True)
    ]
    if dist.is_initialized() and dist.get_world_size() > 1:
        count = torch.tensor([len(plan)], device=device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        plan += [None] * (int(count) - len(plan))
    return plan


def gradient_free(
    sequences: Sequences,
    forward: Forward,
    *,
    micro_batch_size: int,
    layout: TokenLayout,
    max_tokens: int | None = None,
    device: torch.device,
) -> Tensor:
    """(B, T) on the CPU: ``forward`` over ``sequences`` forward by forward (see module),
    without gradients. Collective: every rank makes the same number of forwards."""
    own = None
    steps = sequences.action_mask.shape[1]
    if layout.group is not None:
        sequences, own = gather_sequences(sequences, layout.group)
    result = torch.zeros(sequences.action_mask.shape, dtype=torch.float32)
    plan = pass_rows(
        sequences,
        micro_batch_size=micro_batch_size,
        layout=layout,
        max_tokens=max_tokens,
        device=device,
    )
    with torch.no_grad():
        for rows in plan:
            values = forward(
                sequences.select(torch.zeros(1, dtype=torch.long) if rows is None else rows)
            )
            if rows is not None:
                result[rows, : values.shape[1]] = values.float().cpu()
    return result if own is None else result[own, :steps]
