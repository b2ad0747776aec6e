"""Episodes as padded tensors for training: only the model's own tokens are actions.

The layout is the trainer's single-turn one (``lrft.trainer.experience.Sequences``), with the
whole multi-turn exchange after the prompt as the "response": rows are ``prompt + response``,
right-padded; response-aligned tensors (``B x T``) hold position ``t`` of the response at column
``t``. ``action_mask`` is true at the model's tokens only, so a loss, a KL term or an entropy
masked by it never sees an observation token, and ``response_lengths`` (not the mask's sum, which
skips observations) is where each response ends.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch
from torch import Tensor

from lrft.agents.episode import Episode


@attrs.frozen(kw_only=True, eq=False)
class EpisodeTensors:
    """``B`` episodes: see the module docstring. Padding is 0 (``pad_id`` in ``input_ids``)."""

    input_ids: Tensor  # (B, L) long
    attention_mask: Tensor  # (B, L) long
    prompt_lengths: Tensor  # (B,) long
    response_lengths: Tensor  # (B,) long: turns and observations
    response_tokens: Tensor  # (B, T) long: every response token, model's and observations'
    action_mask: Tensor  # (B, T) bool: the model's tokens
    engine_logprobs: Tensor | None  # (B, T) float32: the engine's, at model tokens
    token_rewards: Tensor  # (B, T) float32: each turn's reward at its last token
    turn_index: Tensor  # (B, T) long: the turn of each model token, -1 elsewhere


def episode_tensors(episodes: Sequence[Episode], *, pad_id: int = 0) -> EpisodeTensors:
    """Stack ``episodes``; engine logprobs only when every episode carries them."""
    if not episodes:
        raise ValueError("episode_tensors needs at least one episode")
    rows = len(episodes)
    width = max(len(e.token_ids) for e in episodes)
    steps = max(len(e.response_token_ids) for e in episodes)
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    attention = torch.zeros((rows, width), dtype=torch.long)
    tokens = torch.zeros((rows, steps), dtype=torch.long)
    mask = torch.zeros((rows, steps), dtype=torch.bool)
    with_logprobs = all(e.logprobs is not None for e in episodes)
    logprobs = torch.zeros((rows, steps), dtype=torch.float32)
    rewards = torch.zeros((rows, steps), dtype=torch.float32)
    turns = torch.full((rows, steps), -1, dtype=torch.long)
    for row, episode in enumerate(episodes):
        ids = episode.token_ids
        size = len(episode.response_token_ids)
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention[row, : len(ids)] = 1
        tokens[row, :size] = torch.tensor(episode.response_token_ids)
        mask[row, :size] = torch.tensor(episode.model_mask)
        if with_logprobs:
            assert episode.logprobs is not None
            logprobs[row, :size] = torch.tensor(episode.logprobs, dtype=torch.float32)
        for turn in episode.turns:
            turns[row, turn.start : turn.start + turn.length] = turn.index
            rewards[row, turn.start + turn.length - 1] = turn.reward
    return EpisodeTensors(
        input_ids=input_ids,
        attention_mask=attention,
        prompt_lengths=torch.tensor([len(e.prompt_token_ids) for e in episodes]),
        response_lengths=torch.tensor([len(e.response_token_ids) for e in episodes]),
        response_tokens=tokens,
        action_mask=mask,
        engine_logprobs=logprobs if with_logprobs else None,
        token_rewards=rewards,
        turn_index=turns,
    )
