"""The episode driver: many episodes at once, one ``generate`` call per round.

:func:`run_episodes` starts ``params.n`` episodes per task (a group, for GRPO), then runs rounds:
every live episode's context goes into one ``generate`` call, each sampled turn is appended to
its episode as the engine returned it, every environment is stepped (in a thread pool when
``max_workers > 1``: tool calls wait on subprocesses), and its observation is appended unless the
episode ends. Round 0 asks for ``n`` samples of each task's prompt, so that a group's first turns
are the engine's ``n`` distinct samples; later rounds ask for one sample per live episode.

Every call is made alike on every rank: the sampling parameters of a round depend only on
``params``, the budget and the round, never on this rank's episodes, and ``any_live`` (in a
trainer, an all-reduce over the ranks) decides whether another round runs, so that a rank whose
episodes have all ended still takes part, with no requests, while another rank's run on. Each
request asks for at most what its episode has left of the token budget; a turn an engine returns
longer than that anyway is cut to it: the kept tokens are a prefix of the sample, so they and
their logprobs are exactly what sampling with the shorter limit would give.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import attrs

from lrft.agents.episode import Episode, TurnRecord
from lrft.api.episodes import (
    Environment,
    EpisodeBudget,
    EpisodeEnd,
    EpisodeStart,
    EpisodeTask,
    ModelTurn,
    StepResult,
)
from lrft.api.errors import EpisodeError
from lrft.api.types import FinishReason, GenerationRequest, GenerationResult, SamplingParams

GenerateFn = Callable[[Sequence[GenerationRequest], SamplingParams], list[GenerationResult]]
AnyLive = Callable[[bool], bool]
"""Told whether this rank has a live episode, says whether any rank has (a collective in a
trainer; the identity on one process)."""

_T = TypeVar("_T")
_R = TypeVar("_R")


def local_any_live(live_here: bool) -> bool:
    return live_here


@attrs.define(kw_only=True, eq=False)
class _Live:
    """An episode in progress."""

    task_index: int
    sample_index: int
    task: EpisodeTask
    env: Environment
    prompt: tuple[int, ...]
    tokens: list[int] = attrs.field(factory=list)
    mask: list[bool] = attrs.field(factory=list)
    logprobs: list[float] = attrs.field(factory=list)
    turns: list[TurnRecord] = attrs.field(factory=list)
    end: EpisodeEnd | None = None

    @property
    def name(self) -> str:
        task = f" ({self.task.task_id!r})" if self.task.task_id else ""
        return f"episode {self.sample_index} of task {self.task_index}{task}"

    @property
    def context(self) -> tuple[int, ...]:
        return self.prompt + tuple(self.tokens)

    def finished(self, with_logprobs: bool) -> Episode:
        assert self.end is not None
        return Episode(
            task_index=self.task_index,
            sample_index=self.sample_index,
            task=self.task,
            prompt_token_ids=self.prompt,
            response_token_ids=tuple(self.tokens),
            model_mask=tuple(self.mask),
            logprobs=tuple(self.logprobs) if with_logprobs else None,
            turns=tuple(self.turns),
            end=self.end,
        )


def run_episodes(
    tasks: Sequence[EpisodeTask],
    make_environment: Callable[[EpisodeTask], Environment],
    generate: GenerateFn,
    params: SamplingParams,
    budget: EpisodeBudget,
    *,
    any_live: AnyLive = local_any_live,
    max_workers: int = 1,
) -> list[Episode]:
    """Run ``params.n`` episodes of each task to their end; task-major, ``n`` per task.

    ``make_environment(task)`` makes a fresh environment per episode. ``generate`` is the
    engine's (or a TP-group wrapper of it) and is called exactly once per round, on every rank
    alike (see the module docstring). Raises :class:`EpisodeError` naming the episode when an
    environment raises or breaks the contract, or when a prompt leaves no room for a turn.
    """
    if max_workers < 1:
        raise ValueError(f"max_workers must be >= 1, got {max_workers}")
    episodes = _start(tasks, make_environment, params.n, budget)
    turn_limit = min(params.max_new_tokens, budget.max_turn_tokens or params.max_new_tokens)
    pool = ThreadPoolExecutor(max_workers) if max_workers > 1 else None
    try:
        round_index = 0
        while any_live(any(e.end is None for e in episodes)):
            live = [e for e in episodes if e.end is None]
            first = round_index == 0
            requests = _requests(episodes if first else live, params.n if first else 1, budget)
            call = attrs.evolve(
                params,
                n=params.n if first else 1,
                max_new_tokens=turn_limit,
                min_new_tokens=min(params.min_new_tokens, turn_limit),
            )
            results = generate(requests, call)
            if len(results) != len(live):
                raise EpisodeError(
                    f"round {round_index}: generate returned {len(results)} results for "
                    f"{len(live)} live episodes"
                )
            turns = [_append_turn(e, r, budget, params) for e, r in zip(live, results, strict=True)]
            steps = _map(pool, _step, list(zip(live, turns, strict=True)))
            for episode, turn, step in zip(live, turns, steps, strict=True):
                _apply(episode, turn, step, budget)
            round_index += 1
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
    if any(e.end is None for e in episodes):
        raise EpisodeError("any_live reported no live episode on any rank while this one had some")
    return [e.finished(params.return_logprobs) for e in episodes]


def _start(
    tasks: Sequence[EpisodeTask],
    make_environment: Callable[[EpisodeTask], Environment],
    n: int,
    budget: EpisodeBudget,
) -> list[_Live]:
    episodes = []
    for task_index, task in enumerate(tasks):
        group: list[_Live] = []
        for sample_index in range(n):
            env = make_environment(task)
            placeholder = _Live(
                task_index=task_index, sample_index=sample_index, task=task, env=env, prompt=()
            )
            start = _call(placeholder, "reset", functools.partial(env.reset, task))
            if not isinstance(start, EpisodeStart):
                raise EpisodeError(
                    f"{placeholder.name}: reset returned {type(start).__name__}, not EpisodeStart"
                )
            prompt = start.prompt_token_ids
            if len(prompt) >= budget.max_total_tokens:
                raise EpisodeError(
                    f"{placeholder.name}: its prompt has {len(prompt)} tokens, which leaves no "
                    f"room for a model turn in max_total_tokens={budget.max_total_tokens}"
                )
            if group and prompt != group[0].prompt:
                raise EpisodeError(
                    f"{placeholder.name}: reset gave another prompt than for episode 0 of the "
                    "same task; a task's episodes must start alike (reset is deterministic in "
                    "the task) so that their first turns are samples of one prompt"
                )
            group.append(attrs.evolve(placeholder, prompt=prompt))
        episodes += group
    return episodes


def _requests(episodes: Sequence[_Live], n: int, budget: EpisodeBudget) -> list[GenerationRequest]:
    # In round 0 each task's group shares one request with n samples. Each request asks for at
    # most what its episode has left; the call's common limit caps it further.
    chosen = [e for e in episodes if e.sample_index == 0] if n > 1 else list(episodes)
    return [
        GenerationRequest(
            prompt_token_ids=e.context,
            request_id=f"{e.task_index}/{e.sample_index}",
            max_new_tokens=budget.max_total_tokens - len(e.context),
        )
        for e in chosen
    ]


def _append_turn(
    episode: _Live, result: GenerationResult, budget: EpisodeBudget, params: SamplingParams
) -> ModelTurn:
    tokens = result.output_token_ids
    if not tokens:
        raise EpisodeError(f"{episode.name}: the engine returned an empty turn")
    if params.return_logprobs and result.logprobs is None:
        raise EpisodeError(f"{episode.name}: the engine returned no logprobs, though asked")
    room = budget.max_total_tokens - len(episode.prompt) - len(episode.tokens)
    finish: FinishReason = result.finish_reason
    if len(tokens) > room:
        # An engine that ignored the request's max_new_tokens: keep the budget anyway (a
        # prefix of the sample is what sampling with the shorter limit would have given).
        tokens, finish = tokens[:room], "length"
    episode.turns.append(
        TurnRecord(
            index=len(episode.turns),
            start=len(episode.tokens),
            length=len(tokens),
            finish_reason=finish,
            reward=0.0,
            observation_length=0,
        )
    )
    episode.tokens += tokens
    episode.mask += [True] * len(tokens)
    if result.logprobs is not None:
        episode.logprobs += result.logprobs[: len(tokens)]
    else:
        episode.logprobs += [0.0] * len(tokens)
    return ModelTurn(index=len(episode.turns) - 1, token_ids=tokens, finish_reason=finish)


def _step(item: tuple[_Live, ModelTurn]) -> StepResult:
    episode, turn = item
    step = _call(episode, f"step of turn {turn.index}", functools.partial(episode.env.step, turn))
    if not isinstance(step, StepResult):
        raise EpisodeError(f"{episode.name}: step returned {type(step).__name__}, not StepResult")
    return step


def _apply(episode: _Live, turn: ModelTurn, step: StepResult, budget: EpisodeBudget) -> None:
    """Record the turn's reward, then end the episode or append the observation."""
    observation = step.observation_token_ids
    if step.done:
        episode.end = "done"
    elif len(episode.turns) >= budget.max_turns:
        episode.end = "max_turns"
    elif len(episode.prompt) + len(episode.tokens) + len(observation) >= budget.max_total_tokens:
        episode.end = "max_total_tokens"  # no room left for a model token after it
    appended = observation if episode.end is None else ()
    episode.turns[-1] = attrs.evolve(
        episode.turns[-1],
        reward=step.reward,
        observation_length=len(appended),
        metrics=step.metrics,
    )
    episode.tokens += appended
    episode.mask += [False] * len(appended)
    episode.logprobs += [0.0] * len(appended)


def _call(episode: _Live, what: str, fn: Callable[[], _T]) -> _T:
    try:
        return fn()
    except EpisodeError as error:
        raise EpisodeError(f"{episode.name}: {error}") from error
    except Exception as error:
        raise EpisodeError(
            f"{episode.name}: the environment's {what} raised {type(error).__name__}: {error}"
        ) from error


def _map(pool: ThreadPoolExecutor | None, fn: Callable[[_T], _R], items: list[_T]) -> list[_R]:
    if pool is None:
        return [fn(item) for item in items]
    return list(pool.map(fn, items))
