"""Multi-turn rollouts: the contract between an environment and the episode driver.

An *episode* alternates model turns and observations. The environment starts it from a task
(:meth:`Environment.reset` gives the prompt as token ids), reads each model turn as the token ids
the engine generated (:meth:`Environment.step`), and answers with the token ids to append after
that turn (a tool's output, a user's reply, the next turn's generation prompt), a reward for the
turn, and whether the episode is over. The driver owns the engine: an environment never
generates. That is what lets a trainer run many episodes per rank and still call the engine
collectively, once per round, with every live episode's next turn in one ``generate`` call.

Everything crosses the boundary as token ids, so that the sequence a trainer trains on is, token
for token, the sequence the engine saw: the model's own tokens are reused exactly as sampled,
never decoded and re-encoded, and observation tokens are appended as the environment produced
them (and never trained on).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Literal, Protocol, runtime_checkable

import attrs

from lrft.api import validators as v
from lrft.api.errors import ConfigError
from lrft.api.types import FinishReason


def _float_metrics(values: Mapping[str, float]) -> Mapping[str, float]:
    return MappingProxyType({str(name): float(value) for name, value in values.items()})


@attrs.frozen(kw_only=True)
class ChatMessage:
    """One message of a conversation, as chat templates take them (``role``, ``content``)."""

    role: str = attrs.field()
    content: str

    @role.validator
    def _check_role(self, attribute: attrs.Attribute[str], value: str) -> None:
        if not value or value != value.strip():
            raise ConfigError(f"{attribute.name} must be a non-empty word, got {value!r}")

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


def _message(position: int, value: ChatMessage | Mapping[str, str]) -> ChatMessage:
    if isinstance(value, ChatMessage):
        return value
    if not isinstance(value, Mapping) or "role" not in value or "content" not in value:
        raise ConfigError(
            f"message {position} of an episode task's prompt must have a 'role' and a "
            f"'content', got {value!r:.80}"
        )
    return ChatMessage(role=value["role"], content=value["content"])


def _prompt(
    value: str | Sequence[ChatMessage | Mapping[str, str]],
) -> str | tuple[ChatMessage, ...]:
    if isinstance(value, str):
        return value
    messages = tuple(_message(i, m) for i, m in enumerate(value))
    if not messages:
        raise ConfigError("an episode task's prompt must not be an empty conversation")
    return messages


@attrs.frozen(kw_only=True)
class EpisodeTask:
    """What an episode is about: handed to :meth:`Environment.reset`.

    ``prompt`` is the task's input as it was written: a string, or a conversation (``{"role",
    "content"}`` mappings are converted to :class:`ChatMessage`). ``reference`` is the ground
    truth where the data has one; ``label`` names the kind of data; ``metadata`` carries anything
    else an environment needs. ``task_id`` identifies the task in errors and saved episodes.
    """

    prompt: str | tuple[ChatMessage, ...] = attrs.field(converter=_prompt)
    reference: str | None = None
    label: str = ""
    # Left out of the hash (a read-only mapping is not hashable); equality still compares it.
    metadata: Mapping[str, Any] = attrs.field(factory=dict, converter=v.read_only, hash=False)
    task_id: str = ""


@attrs.frozen(kw_only=True)
class EpisodeStart:
    """The prompt an episode starts from, as token ids (the model's first turn follows it)."""

    prompt_token_ids: tuple[int, ...] = attrs.field(
        converter=v.int_tuple, validator=v.non_negative_ints
    )

    def __attrs_post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ConfigError("an episode's prompt_token_ids must not be empty")


@attrs.frozen(kw_only=True)
class ModelTurn:
    """One model turn as the engine generated it.

    ``token_ids`` are the sampled tokens, in order, including the stop token that ended the turn
    when ``finish_reason`` is ``"stop"``; with ``"length"`` the turn was cut by its token budget.
    ``index`` counts the episode's model turns from 0.
    """

    index: int = attrs.field(validator=v.non_negative)
    token_ids: tuple[int, ...] = attrs.field(converter=v.int_tuple, validator=v.non_negative_ints)
    finish_reason: FinishReason


@attrs.frozen(kw_only=True)
class StepResult:
    """What an environment answers to a model turn.

    ``observation_token_ids`` are appended after the turn, before the next one: the rendered tool
    output or user reply and whatever the next turn's prompt needs (a chat template's generation
    prompt). They are context for the model, never trained on. ``reward`` is this turn's reward
    (an outcome reward is the reward of the last turn). ``done`` ends the episode; an episode that
    is done takes no observation. ``metrics`` are named per-turn values for logging (tool calls,
    tool failures).
    """

    observation_token_ids: tuple[int, ...] = attrs.field(
        default=(), converter=v.int_tuple, validator=v.non_negative_ints
    )
    reward: float = attrs.field(default=0.0, converter=float)
    done: bool = False
    metrics: Mapping[str, float] = attrs.field(factory=dict, converter=_float_metrics, hash=False)

    def __attrs_post_init__(self) -> None:
        if not math.isfinite(self.reward):
            raise ConfigError(f"a step's reward must be finite, got {self.reward!r}")
        if self.done and self.observation_token_ids:
            raise ConfigError(
                f"a step that ends the episode (done=True) takes no observation, got "
                f"{len(self.observation_token_ids)} observation tokens"
            )


EpisodeEnd = Literal["done", "max_turns", "max_total_tokens"]
"""Why an episode ended: the environment said so, or a budget of :class:`EpisodeBudget` ran out."""


@attrs.frozen(kw_only=True)
class EpisodeBudget:
    """The token budgets that end an episode cleanly, whatever the model and environment do.

    - ``max_turns``: model turns per episode; the episode ends after its last one, and the
      environment's observation to that turn is not appended (no turn would read it);
    - ``max_total_tokens``: prompt, every turn and every observation together (the context the
      model must hold); a turn is given at most what is left, and an observation that would
      leave no room for another model token ends the episode instead of being appended;
    - ``max_turn_tokens``: tokens one model turn may generate (``None``: what is left of
      ``max_total_tokens``; a driver also caps it by the ``max_new_tokens`` it samples with).
    """

    max_turns: int = attrs.field(validator=v.positive_int)
    max_total_tokens: int = attrs.field(validator=v.positive_int)
    max_turn_tokens: int | None = attrs.field(default=None, validator=v.optional(v.positive_int))


@runtime_checkable
class Environment(Protocol):
    """One episode at a time of a multi-turn task: prompts, observations and rewards as tokens.

    An instance runs one episode at a time: a driver makes one instance per concurrent episode
    and may call different instances from different threads, but never one instance from two
    threads at once. An environment never calls the rollout engine.

    - ``reset(task)`` starts a new episode of ``task`` (discarding any episode in progress) and
      returns its prompt. It is deterministic in the task: a trainer groups the episodes of one
      task (GRPO), and their first turns are sampled from one prompt.
    - ``step(turn)`` takes the model's next turn (``turn.index`` counts from 0 after each reset)
      and returns a :class:`StepResult`. It must accept *any* turn the model can produce: token
      ids that do not decode to valid text, stray special tokens, a turn cut at its token
      budget, a malformed tool call. The answer to a bad turn is an observation (or the end of
      the episode with its reward), never an exception; a failing or hanging tool is the tool's
      to time out and report (see :class:`lrft.api.tools.Tool`). ``step`` before ``reset`` or
      after a step that returned ``done`` raises :class:`~lrft.api.errors.EpisodeError`.

    Observation tokens must be what the model will see at inference after its own tokens: with a
    chat template, the rest of the template's rendering of the conversation (see
    ``lrft.agents.chat``), never a re-encoding of the model's turn.
    """

    def reset(self, task: EpisodeTask) -> EpisodeStart: ...

    def step(self, turn: ModelTurn) -> StepResult: ...
