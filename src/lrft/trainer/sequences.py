"""Rollouts as padded tensors: ``prompt + response`` token ids, right-padded, and where each
response sits in them.

Response-aligned tensors (``B x T``) hold position ``t`` of the ``t``-th generated token. Right
padding keeps each real token's position id equal to its index, so no position ids are passed.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch
from torch import Tensor

from lrft.api.types import GenerationResult


@attrs.frozen(kw_only=True, eq=False)
class Sequences:
    """Padded ``prompt + response`` token ids and where each response sits in them."""

    input_ids: Tensor  # (B, L)
    attention_mask: Tensor  # (B, L)
    prompt_lengths: Tensor  # (B,)
    action_mask: Tensor  # (B, T) bool
    action_tokens: Tensor  # (B, T) the generated ids, 0 where masked
    # (B,) long: where each response ends, when the action mask has holes in it (the
    # observations of a multi-turn episode, :func:`lrft.trainer.episodes.pack_episodes`);
    # None: a response is its action tokens, the mask's sum
    response_lengths: Tensor | None = None

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def select(self, rows: Tensor) -> Sequences:
        """Rows ``rows``, trimmed to the longest sequence and response among them."""
        mask = self.attention_mask[rows]
        actions = self.action_mask[rows]
        lengths = None if self.response_lengths is None else self.response_lengths[rows]
        width = int(mask.sum(-1).max())
        steps = int((actions.sum(-1) if lengths is None else lengths).max())
        return Sequences(
            input_ids=self.input_ids[rows, :width],
            attention_mask=mask[:, :width],
            prompt_lengths=self.prompt_lengths[rows],
            action_mask=actions[:, :steps],
            action_tokens=self.action_tokens[rows, :steps],
            response_lengths=lengths,
        )


def pack(results: Sequence[GenerationResult], pad_id: int = 0) -> Sequences:
    """Right-padded tensors of ``results`` (every response has at least one token)."""
    rows = [list(r.prompt_token_ids) + list(r.output_token_ids) for r in results]
    width = max(len(row) for row in rows)
    steps = max(len(r.output_token_ids) for r in results)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    actions = torch.zeros((len(rows), steps), dtype=torch.long)
    action_mask = torch.zeros((len(rows), steps), dtype=torch.bool)
    for i, (row, result) in enumerate(zip(rows, results, strict=True)):
        input_ids[i, : len(row)] = torch.tensor(row)
        attention[i, : len(row)] = 1
        n = len(result.output_token_ids)
        actions[i, :n] = torch.tensor(result.output_token_ids)
        action_mask[i, :n] = True
    prompt_lengths = torch.tensor([len(r.prompt_token_ids) for r in results])
    return Sequences(
        input_ids=input_ids,
        attention_mask=attention,
        prompt_lengths=prompt_lengths,
        action_mask=action_mask,
        action_tokens=actions,
    )


def response_positions(sequences: Sequences) -> Tensor:
    """(B, T): the position whose logits predict each response token (prompt length + t - 1)."""
    steps = sequences.action_mask.shape[1]
    offsets = torch.arange(steps)
    width = sequences.input_ids.shape[1]
    return (sequences.prompt_lengths[:, None] - 1 + offsets[None, :]).clamp(max=width - 1)
