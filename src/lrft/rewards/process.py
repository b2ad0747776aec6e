"""Process rewards: a score for each reasoning step of a response, placed on the token where the
step ends (Lightman et al. 2023, "Let's Verify Step by Step"; Wang et al. 2024, "Math-Shepherd").

A response's steps are separated by a text (``--prm_step_separator``, ``"\\n\\n"`` say): each
occurrence of the separator ends a step at the token that holds its last character, and the
response's last token that is not a special token (its end-of-sequence, say) ends the last step,
unless a separator already ended one there. Steps are found in the decoded text, so a separator
that the tokenizer merges with its neighbours into one token is found all the same.

A process reward model is a token-classification model (transformers'
``*ForTokenClassification``) reading the student's token ids; its output at a step's last token
is the step's score: ``sigmoid(logit)`` for a one-label head (what ``lrft train-rm
--step_separator`` trains, with a binary cross-entropy on step labels), the probability of
label 1 for a two-label head (the good-step class of a classifier trained with two).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import torch
from torch import Tensor

Decode = Callable[[Sequence[int]], str]


def _char_ends(token_ids: Sequence[int], decode: Decode) -> tuple[str, list[int]]:
    """The decoded text and, for each token, how many characters of it end by that token."""
    text = decode(token_ids)
    pieces = [decode([token]) for token in token_ids]
    if "".join(pieces) == text:
        ends, total = [], 0
        for piece in pieces:
            total += len(piece)
            ends.append(total)
        return text, ends
    # a character split across tokens (bytes of UTF-8) decodes alone as a replacement: count by
    # prefixes instead, kept non-decreasing
    ends, longest = [], 0
    for index in range(len(token_ids)):
        longest = max(longest, len(decode(token_ids[: index + 1])))
        ends.append(longest)
    return text, ends


def step_ends(
    token_ids: Sequence[int],
    separator: str,
    decode: Decode,
    special_ids: Collection[int] = (),
) -> list[int]:
    """The indices (into ``token_ids``, a response) of the tokens where its steps end, in order
    (see the module docstring); ``[]`` for a response of special tokens only."""
    if not separator:
        raise ValueError("the step separator must be a non-empty text")
    last = len(token_ids) - 1
    while last >= 0 and token_ids[last] in special_ids:
        last -= 1
    if last < 0:
        return []
    text, ends = _char_ends(token_ids[: last + 1], decode)
    found: list[int] = []
    start = text.find(separator)
    token = 0
    while start >= 0:
        end = start + len(separator)
        while ends[token] < end:
            token += 1
        if not found or found[-1] != token:
            found.append(token)
        start = text.find(separator, end)
    if not found or found[-1] != last:
        found.append(last)
    return found


def step_probabilities(logits: Tensor) -> Tensor:
    """(..., labels) -> (...): a step's score from a token-classification head's logits:
    ``sigmoid`` of one label, or the softmax probability of label 1 of two."""
    if logits.shape[-1] == 1:
        return torch.sigmoid(logits[..., 0].float())
    if logits.shape[-1] == 2:
        return torch.softmax(logits.float(), dim=-1)[..., 1]
    raise ValueError(f"a process reward model has a head of 1 or 2 labels, got {logits.shape[-1]}")


def place_step_rewards(
    ends: Sequence[Sequence[int]], scores: Sequence[Sequence[float]], width: int
) -> Tensor:
    """(B, ``width``): each row's step scores on the tokens where its steps end, 0 elsewhere."""
    rewards = torch.zeros((len(ends), width), dtype=torch.float32)
    for row, (positions, values) in enumerate(zip(ends, scores, strict=True)):
        if len(positions) != len(values):
            raise ValueError(f"row {row}: {len(values)} scores for {len(positions)} step ends")
        for position, value in zip(positions, values, strict=True):
            rewards[row, position] = value
    return rewards
