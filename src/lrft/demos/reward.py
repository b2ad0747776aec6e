"""The demo's rule reward: :class:`AdditionReward` as an ``lrft.rewards.RewardFn``, and
:func:`exact_answer`, the per-sample ``reward_fn`` that ``lrft train`` names for the demo."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from lrft.api import validators as v
from lrft.api.errors import ConfigError
from lrft.demos.task import extract_answer, is_correct
from lrft.rewards.base import RewardError, RewardOutput, RewardSample


@attrs.frozen(kw_only=True)
class AdditionReward:
    """1.0 when the response states exactly the reference sum, else ``format_weight`` for a
    well-formed integer and 0.0 for anything else.

    ``format_weight`` (default 0: a binary reward) is partial credit for answering with a plain
    integer, whatever its value. The metrics ``correct`` and ``well_formed`` (0/1 per sample) are
    reported whatever the weight. A sample without a reference is an error.
    """

    format_weight: float = attrs.field(default=0.0, validator=[v.non_negative, v.finite])
    name: str = "addition"

    def __attrs_post_init__(self) -> None:
        if self.format_weight >= 1.0:
            raise ConfigError(
                f"format_weight must be < 1 (an exact answer scores 1), got {self.format_weight!r}"
            )

    def __call__(self, samples: Sequence[RewardSample]) -> RewardOutput:
        correct: list[float] = []
        well_formed: list[float] = []
        for index, sample in enumerate(samples):
            if sample.reference is None:
                raise RewardError(
                    reward=self.name,
                    sample_index=index,
                    detail="the sample has no reference answer (set reference_key to the "
                    "column holding the sum)",
                )
            stated = extract_answer(sample.response)
            well_formed.append(float(stated is not None))
            correct.append(float(stated is not None and stated == sample.reference.strip()))
        scores = [
            1.0 if right else self.format_weight * formed
            for right, formed in zip(correct, well_formed, strict=True)
        ]
        return RewardOutput(scores=scores, metrics={"correct": correct, "well_formed": well_formed})


def exact_answer(sample: RewardSample) -> float:
    """1 when the response states the reference integer exactly, else 0."""
    return float(sample.reference is not None and is_correct(sample.response, sample.reference))
