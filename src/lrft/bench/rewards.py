"""The benchmark's synthetic reward: the response's length in characters / 1000, TRL's W1 reward.

It varies between the responses of a random model (their decoded texts differ in length), so
advantages are non-zero and the policy update does real work.
"""

from __future__ import annotations

from lrft.rewards import RewardSample


def text_length(sample: RewardSample) -> float:
    return len(sample.response) / 1000.0


TEXT_LENGTH = "lrft.bench.rewards:text_length"
"""The ``--reward_fn`` spec of :func:`text_length`."""
