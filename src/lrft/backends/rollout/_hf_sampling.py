"""Sampling on the device for the ``hf`` engine's static loop, with no host round trip.

The semantics of transformers' logits processors: stop ids suppressed before
``min_new_tokens``, temperature, ``TopKLogitsWarper`` then ``TopPLogitsWarper`` (one ascending
sort; k and p read from device tensors, so that one captured graph serves every value), then one
categorical draw by the exponential race ``argmax(p / E)``, ``E ~ Exp(1)``. Greedy is the
argmax. The logprob reported is the contract's: ``log_softmax(logits / T)`` of the chosen token,
before suppression or truncation.
"""

from __future__ import annotations

import attrs
import torch


@attrs.frozen
class Mode:
    """What a captured step computes; everything else it reads from buffers."""

    greedy: bool
    truncate: bool
    logprobs: bool


def choose(
    logits: torch.Tensor,
    mode: Mode,
    *,
    temperature: torch.Tensor,
    top_k_index: torch.Tensor,
    top_p: torch.Tensor,
    suppressed: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each row's token ``(rows,)`` and, in ``mode.logprobs``, its logprob ``(rows, 1)``.

    ``suppressed`` ``(rows, vocab)`` marks the ids a row may not emit yet (stop ids before its
    ``min_new_tokens``)."""
    raw = logits.float()
    scores = raw if mode.greedy else raw / temperature
    filtered = scores.masked_fill(suppressed, float("-inf"))
    if mode.greedy:
        token = filtered.argmax(-1)
    else:
        if mode.truncate:
            filtered = top_k_top_p(filtered, top_k_index, top_p)
        probabilities = filtered.softmax(-1)
        race = torch.empty_like(probabilities).exponential_()
        # Exp(1) draws of exactly 0 would turn a removed token's 0 / 0 into NaN, which argmax
        # prefers.
        race.clamp_min_(torch.finfo(race.dtype).tiny)
        token = (probabilities / race).argmax(-1)
    if not mode.logprobs:
        return token, None
    return token, scores.log_softmax(-1).gather(1, token[:, None])


def top_k_top_p(
    scores: torch.Tensor, top_k_index: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """transformers' ``TopKLogitsWarper`` then ``TopPLogitsWarper`` (removed scores are -inf),
    on one ascending sort, with k and p read from device tensors."""
    ordered, order = scores.sort(dim=-1)
    threshold = ordered.gather(1, top_k_index)
    ordered = ordered.masked_fill(ordered < threshold, float("-inf"))
    cumulative = ordered.softmax(-1).cumsum(-1)
    removed = cumulative <= 1 - top_p
    removed[:, -1] = False  # the most likely token always stays
    ordered = ordered.masked_fill(removed, float("-inf"))
    return torch.empty_like(scores).scatter_(1, order, ordered)
