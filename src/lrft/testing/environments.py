"""A conformance check any :class:`~lrft.api.Environment` can be run through.

:func:`check_environment` makes environments with your factory and drives them through lrft's
own episode driver (:func:`lrft.agents.run_episodes`) with scripted model turns (yours, to
reach the paths that matter) and with random ones (any token id, stop tokens, turns cut at
their length limit), and checks the contract of ``lrft.api.episodes``:

- the factory makes an ``Environment`` (``isinstance``, the Protocol is runtime-checkable);
- ``reset`` is deterministic in the task, on fresh and on used instances;
- ``step`` before ``reset``, and after a step that ended the episode, raises ``EpisodeError``;
- any turn gets a :class:`~lrft.api.StepResult` (finite reward, observation ids inside the
  vocabulary), never an exception: the random episodes run to their end under the budget;
- with ``deterministic=True``, the same task and turns give the same observations, rewards and
  ends on a fresh instance, and each task's episode (with your turns, and with fixed random
  ones) gives the same alone, among every other task's episodes (as a trainer's batch runs
  them, interleaved turn by turn) and again after them: instances that share state (one
  episode rewarded for another's answer) fail.

A failure raises :class:`EnvironmentCheckError` saying which rule broke, on which task and turn.
Use it from a test::

    def test_my_environment() -> None:
        check_environment(lambda: MyEnvironment(tokenizer), tasks, vocab_size=len(tokenizer))
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import attrs

from lrft.agents.driver import run_episodes
from lrft.agents.episode import Episode
from lrft.api.episodes import Environment, EpisodeBudget, EpisodeTask, ModelTurn
from lrft.api.errors import EpisodeError
from lrft.api.types import GenerationRequest, GenerationResult, SamplingParams

TurnScript = Callable[[EpisodeTask, int, Sequence[int]], Sequence[int]]
"""The model's turn: from the task, the turn's index and the context so far, its token ids."""


class EnvironmentCheckError(AssertionError):
    """An environment broke its contract; the message names the rule, task and turn."""


def _scripted_generate(
    tasks: Sequence[EpisodeTask], script: Callable[[int, int, Sequence[int]], Sequence[int]]
) -> Callable[[Sequence[GenerationRequest], SamplingParams], list[GenerationResult]]:
    """An engine that answers each request with the script's turn (requests are named
    ``task/sample`` by the driver); ``finish_reason`` is ``length`` at the token limit."""
    turns: dict[str, int] = {}

    def generate(
        requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        results = []
        for request in requests:
            task_index = int(request.request_id.split("/")[0])
            index = turns.get(request.request_id, 0)
            turns[request.request_id] = index + 1
            tokens = tuple(script(task_index, index, request.prompt_token_ids))
            if not tokens:
                raise EnvironmentCheckError(f"the turn script gave task {task_index} no tokens")
            # As an engine does: the turn ends at its first stop token, or at the length limit.
            stops = [i for i, t in enumerate(tokens) if t in params.stop_token_ids]
            stopped = bool(stops) and stops[0] < params.max_new_tokens
            cut = tokens[: stops[0] + 1] if stopped else tokens[: params.max_new_tokens]
            results.append(
                GenerationResult(
                    request_id=request.request_id,
                    sample_index=0,
                    prompt_token_ids=request.prompt_token_ids,
                    output_token_ids=cut,
                    finish_reason="stop" if stopped else "length",
                    logprobs=tuple(-1.0 for _ in cut),
                )
            )
        return results

    return generate


def _episodes(
    make: Callable[[], Environment],
    tasks: Sequence[EpisodeTask],
    script: Callable[[int, int, Sequence[int]], Sequence[int]],
    budget: EpisodeBudget,
    stop_token_ids: Sequence[int],
) -> list[Episode]:
    params = SamplingParams(
        max_new_tokens=budget.max_turn_tokens or budget.max_total_tokens,
        stop_token_ids=tuple(stop_token_ids),
        return_logprobs=True,
    )
    try:
        return run_episodes(
            tasks, lambda _: make(), _scripted_generate(tasks, script), params, budget
        )
    except EpisodeError as error:
        raise EnvironmentCheckError(f"an episode failed: {error}") from error


def _check_vocabulary(episodes: Sequence[Episode], vocab_size: int | None) -> None:
    if vocab_size is None:
        return
    for episode in episodes:
        for token in episode.token_ids:
            if token >= vocab_size:
                raise EnvironmentCheckError(
                    f"task {episode.task_index}: token id {token} is outside the vocabulary "
                    f"({vocab_size})"
                )


def _check_reset(make: Callable[[], Environment], tasks: Sequence[EpisodeTask]) -> None:
    for index, task in enumerate(tasks):
        first, second = make(), make()
        if not isinstance(first, Environment):
            raise EnvironmentCheckError(
                f"the factory made {type(first).__name__}, not an Environment"
            )
        try:
            first.step(ModelTurn(index=0, token_ids=(0,), finish_reason="length"))
        except EpisodeError:
            pass
        else:
            raise EnvironmentCheckError("step before reset did not raise EpisodeError")
        prompt = first.reset(task).prompt_token_ids
        if second.reset(task).prompt_token_ids != prompt:
            raise EnvironmentCheckError(f"task {index}: two fresh instances reset to other prompts")
        if first.reset(task).prompt_token_ids != prompt:
            raise EnvironmentCheckError(f"task {index}: a second reset gave another prompt")


def _check_done_is_final(make: Callable[[], Environment], episodes: Sequence[Episode]) -> None:
    for episode in episodes:
        if episode.end != "done":
            continue
        env = make()
        env.reset(episode.task)
        for turn in episode.turns:
            env.step(
                ModelTurn(
                    index=turn.index,
                    token_ids=episode.turn_token_ids(turn.index),
                    finish_reason=turn.finish_reason,
                )
            )
        after = ModelTurn(index=len(episode.turns), token_ids=(0,), finish_reason="length")
        try:
            env.step(after)
        except EpisodeError:
            continue
        raise EnvironmentCheckError(
            f"task {episode.task_index}: step after the episode was done did not raise EpisodeError"
        )


def _replay(episode: Episode) -> Callable[[int, int, Sequence[int]], Sequence[int]]:
    return lambda _task, index, _context: episode.turn_token_ids(index)


def _same(first: Episode, second: Episode) -> bool:
    return (
        first.token_ids == second.token_ids
        and first.model_mask == second.model_mask
        and [t.reward for t in first.turns] == [t.reward for t in second.turns]
        and first.end == second.end
    )


def _difference(alone: Episode, other: Episode) -> str:
    """Where ``other`` first departs from ``alone``: a turn's tokens, reward or observation, or
    the end."""
    for index, (a, b) in enumerate(zip(alone.turns, other.turns, strict=False)):
        if alone.turn_token_ids(index) != other.turn_token_ids(index):
            return f"turn {index}'s tokens differ"
        if a.reward != b.reward:
            return f"turn {index} is rewarded {b.reward} where alone it was rewarded {a.reward}"
        if (a.observation_length, a.start) != (b.observation_length, b.start):
            return f"turn {index}'s observation differs"
    if len(alone.turns) != len(other.turns) or alone.end != other.end:
        return (
            f"it ends after {len(other.turns)} turns ({other.end}) where alone it ended after "
            f"{len(alone.turns)} ({alone.end})"
        )
    return "its tokens differ"


def _fixed_random_turns(
    tasks: Sequence[EpisodeTask], highest: int, seed: int
) -> list[list[list[int]]]:
    """Per task, per turn, token ids drawn once, so the same turns can be played again."""
    turns = []
    for index in range(len(tasks)):
        rng = random.Random(seed * 7919 + index)
        turns.append(
            [[rng.randrange(highest) for _ in range(rng.randint(1, 12))] for _ in range(8)]
        )
    return turns


Script = Callable[[int, int, Sequence[int]], Sequence[int]]


def _as_task(play: Script, task: int) -> Script:
    """``play``'s turns of task ``task`` for an episode that is task 0 of a run of its own."""
    return lambda _task, index, context: play(task, index, context)


def _check_isolation(
    make: Callable[[], Environment],
    tasks: Sequence[EpisodeTask],
    script: Script | None,
    budget: EpisodeBudget,
    stop_token_ids: Sequence[int],
    fixed: Sequence[Sequence[Sequence[int]]],
) -> None:
    """Each task's episodes (your turns, fixed random ones) alone, then all of them together in
    one run of the driver, then alone again: every run of the same turns must give the same
    episode. The random turns of a task run first, before any other of its episodes."""

    def fixed_turn(task: int, index: int, _context: Sequence[int]) -> Sequence[int]:
        return fixed[task % len(tasks)][index % len(fixed[task % len(tasks)])]

    scripts: list[tuple[str, Script]] = [("fixed random turns", fixed_turn)]
    if script is not None:
        scripts.append(("your turns", script))

    def alone_run(play: Script, index: int) -> Episode:
        return _episodes(make, [tasks[index]], _as_task(play, index), budget, stop_token_ids)[0]

    alone = {
        (kind, index): alone_run(play, index)
        for kind, play in scripts
        for index in range(len(tasks))
    }
    together_tasks = [task for _ in scripts for task in tasks]

    def together_turn(position: int, index: int, context: Sequence[int]) -> Sequence[int]:
        _, play = scripts[position // len(tasks)]
        return play(position % len(tasks), index, context)

    together = _episodes(make, together_tasks, together_turn, budget, stop_token_ids)
    for episode in together:
        kind = scripts[episode.task_index // len(tasks)][0]
        index = episode.task_index % len(tasks)
        if not _same(alone[kind, index], episode):
            raise EnvironmentCheckError(
                f"task {index} ({tasks[index].task_id!r}) with {kind}: the same turns gave "
                "another episode among the other tasks' episodes (one run of the driver, "
                f"interleaved) than alone: {_difference(alone[kind, index], episode)}. {_SHARED}"
            )
    for index, task in enumerate(tasks):
        again = alone_run(fixed_turn, index)
        if not _same(alone["fixed random turns", index], again):
            first = alone["fixed random turns", index]
            raise EnvironmentCheckError(
                f"task {index} ({task.task_id!r}) with fixed random turns: the same turns gave "
                "another episode after every task's episodes than alone before them: "
                f"{_difference(first, again)}. {_SHARED}"
            )


_SHARED = (
    "An episode must depend on its task and turns only: instances that share state (class or "
    "module attributes, a cache) let one episode see another's answers"
)


@attrs.frozen(kw_only=True)
class EnvironmentCheckReport:
    """The episodes the check ran: ``scripted`` with your turns, ``random`` with random ones."""

    scripted: tuple[Episode, ...]
    random: tuple[Episode, ...]


def check_environment(
    make: Callable[[], Environment],
    tasks: Sequence[EpisodeTask],
    *,
    script: TurnScript | None = None,
    vocab_size: int | None = None,
    stop_token_ids: Sequence[int] = (),
    budget: EpisodeBudget | None = None,
    random_episodes: int = 4,
    deterministic: bool = True,
    seed: int = 0,
) -> EnvironmentCheckReport:
    """Check the environments ``make`` builds against the contract; see the module docstring.

    ``random`` turns draw token ids below ``vocab_size`` (default: the ids the prompts use), a
    stop token from ``stop_token_ids`` ending some of them.
    """
    if not tasks:
        raise ValueError("check_environment needs at least one task")
    budget = budget or EpisodeBudget(max_turns=4, max_total_tokens=512, max_turn_tokens=32)
    _check_reset(make, tasks)
    highest = vocab_size or 1 + max(max(make().reset(t).prompt_token_ids) for t in tasks)
    if deterministic:
        user = script
        _check_isolation(
            make,
            tasks,
            None if user is None else lambda t, i, context: user(tasks[t], i, context),
            budget,
            stop_token_ids,
            _fixed_random_turns(tasks, highest, seed),
        )
    scripted: list[Episode] = []
    if script is not None:
        user_script = script
        scripted = _episodes(
            make,
            tasks,
            lambda t, i, context: user_script(tasks[t], i, context),
            budget,
            stop_token_ids,
        )
        _check_vocabulary(scripted, vocab_size)
        if deterministic:
            for episode in scripted:
                again = _episodes(
                    make, [tasks[episode.task_index]], _replay(episode), budget, stop_token_ids
                )[0]
                if not _same(episode, again):
                    raise EnvironmentCheckError(
                        f"task {episode.task_index}: the same turns gave another episode"
                    )
    rng = random.Random(seed)

    def random_turn(_task: int, _index: int, _context: Sequence[int]) -> Sequence[int]:
        tokens = [rng.randrange(highest) for _ in range(rng.randint(1, 40))]
        if stop_token_ids and rng.random() < 0.5:
            tokens[rng.randrange(len(tokens))] = rng.choice(list(stop_token_ids))
        return tokens

    fuzzed = _episodes(
        make,
        [tasks[i % len(tasks)] for i in range(random_episodes)],
        random_turn,
        budget,
        stop_token_ids,
    )
    _check_vocabulary(fuzzed, vocab_size)
    _check_done_is_final(make, [*scripted, *fuzzed])
    return EnvironmentCheckReport(scripted=tuple(scripted), random=tuple(fuzzed))
