"""What the episode driver produces: one record per episode, token for token."""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

import attrs

from lrft.api.episodes import EpisodeEnd, EpisodeTask
from lrft.api.types import FinishReason


def _float_metrics(values: Mapping[str, float]) -> Mapping[str, float]:
    return MappingProxyType({str(name): float(value) for name, value in values.items()})


@attrs.frozen(kw_only=True)
class TurnRecord:
    """One model turn of an episode.

    The turn's tokens are ``response_token_ids[start : start + length]`` of its
    :class:`Episode`; the ``observation_length`` tokens after them are the environment's answer
    (0 after the last turn, whose observation, if any, was not appended).
    """

    index: int
    start: int
    length: int
    finish_reason: FinishReason
    reward: float
    observation_length: int
    metrics: Mapping[str, float] = attrs.field(factory=dict, converter=_float_metrics, hash=False)


@attrs.frozen(kw_only=True, eq=False)
class Episode:
    """One finished episode: the prompt, then every turn and observation, in order.

    ``response_token_ids`` holds everything after the prompt; ``model_mask[i]`` is true where
    token ``i`` of it was sampled by the model (the tokens to train on) and false at observation
    tokens. ``logprobs[i]`` is the engine's log-probability of a model token (0.0 at observation
    tokens); ``None`` when the engine was not asked for them. ``task_index`` and
    ``sample_index`` place the episode in its group: the ``n`` episodes of one task.
    """

    task_index: int
    sample_index: int
    task: EpisodeTask
    prompt_token_ids: tuple[int, ...]
    response_token_ids: tuple[int, ...]
    model_mask: tuple[bool, ...]
    logprobs: tuple[float, ...] | None
    turns: tuple[TurnRecord, ...]
    end: EpisodeEnd

    def __attrs_post_init__(self) -> None:
        size = len(self.response_token_ids)
        if len(self.model_mask) != size:
            raise ValueError(f"model_mask has {len(self.model_mask)} entries for {size} tokens")
        if self.logprobs is not None and len(self.logprobs) != size:
            raise ValueError(f"logprobs has {len(self.logprobs)} entries for {size} tokens")
        if not self.turns:
            raise ValueError("an episode has at least one model turn")
        expected: list[bool] = []
        for turn in self.turns:
            if turn.start != len(expected) or turn.length < 1:
                raise ValueError(f"turn {turn.index} does not follow the tokens before it")
            expected += [True] * turn.length + [False] * turn.observation_length
        if tuple(expected) != self.model_mask:
            raise ValueError("the turns do not tile the response as model_mask says")
        if not all(math.isfinite(turn.reward) for turn in self.turns):
            raise ValueError("every turn's reward must be finite")

    @property
    def token_ids(self) -> tuple[int, ...]:
        return self.prompt_token_ids + self.response_token_ids

    @property
    def reward(self) -> float:
        """The episode's return: the sum of its turns' rewards."""
        return math.fsum(turn.reward for turn in self.turns)

    @property
    def model_token_count(self) -> int:
        return sum(turn.length for turn in self.turns)

    def turn_token_ids(self, index: int) -> tuple[int, ...]:
        turn = self.turns[index]
        return self.response_token_ids[turn.start : turn.start + turn.length]
