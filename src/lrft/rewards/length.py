"""Length shaping: DAPO's soft overlong penalty as a reward.

The formula lives in :func:`lrft.algo.shaping.overlong_penalty`; this module only measures each
response and reports the length it measured, so a combined reward can add the penalty to a
correctness score (``CombinedReward`` with a weight of 1 on both).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import torch

from lrft.algo.shaping import overlong_penalty
from lrft.api.validators import finite, non_negative, positive_number
from lrft.rewards._checks import name_validator
from lrft.rewards.base import RewardOutput, RewardSample

RESPONSE_LENGTH_KEY = "response_length"
"""The metadata key under which the trainer stores the number of generated tokens."""


def generated_tokens(sample: RewardSample) -> int:
    """The number of generated tokens, from ``sample.metadata["response_length"]``.

    The tokens the engine generated are the length the limit applies to; re-tokenising the text
    may not give them back.
    """
    value = sample.metadata[RESPONSE_LENGTH_KEY]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"metadata[{RESPONSE_LENGTH_KEY!r}] must be an int >= 0, got {value!r}")
    return value


def characters(sample: RewardSample) -> int:
    """The response's length in characters (for rewards used without token counts)."""
    return len(sample.response)


@attrs.frozen(kw_only=True)
class OverlongPenalty:
    """0 up to ``max_length - buffer_length``, then linearly down to ``-penalty_factor`` at
    ``max_length``, and ``-penalty_factor`` beyond (Yu et al. 2025, "DAPO", soft overlong
    punishment).

    ``length`` measures a response; by default the generated token count from the sample's
    metadata (:func:`generated_tokens`), or :func:`characters`, or any callable. The metric
    ``length`` records what it measured.
    """

    max_length: int = attrs.field(validator=positive_number)
    buffer_length: int = attrs.field(validator=positive_number)
    penalty_factor: float = attrs.field(default=1.0, validator=[finite, non_negative])
    length: Callable[[RewardSample], int] = generated_tokens
    name: str = attrs.field(default="overlong", validator=name_validator)

    def __attrs_post_init__(self) -> None:
        if self.buffer_length > self.max_length:
            raise ValueError(
                f"buffer_length ({self.buffer_length}) must be <= max_length ({self.max_length})"
            )

    def __call__(self, samples: Sequence[RewardSample]) -> RewardOutput:
        lengths = torch.tensor([self.length(s) for s in samples], dtype=torch.float64)
        penalty = overlong_penalty(
            lengths,
            max_len=self.max_length,
            buffer_len=self.buffer_length,
            penalty_factor=self.penalty_factor,
        )
        return RewardOutput(scores=penalty, metrics={"length": lengths})
