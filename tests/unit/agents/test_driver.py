"""The episode driver: rounds, groups, budgets, collective calls, concurrency, errors."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import attrs
import pytest
import torch

from lrft.agents import Episode, episode_tensors, run_episodes
from lrft.api import (
    EpisodeBudget,
    EpisodeError,
    EpisodeStart,
    EpisodeTask,
    GenerationRequest,
    GenerationResult,
    ModelTurn,
    SamplingParams,
    StepResult,
)

DONE = 3
OBSERVATION = (8, 9)


@attrs.define
class CountingEnv:
    """Prompt ``prompt``; after each turn the observation ``(8, 9)``, reward 0.5; a turn that
    holds token 3 ends the episode with reward ``turn index + 1``."""

    prompt: tuple[int, ...] = (5, 6, 7)
    observation: tuple[int, ...] = OBSERVATION
    raise_at: int | None = None
    barrier: threading.Barrier | None = None
    turns: list[ModelTurn] = attrs.field(factory=list)

    def reset(self, task: EpisodeTask) -> EpisodeStart:
        self.turns = []
        return EpisodeStart(prompt_token_ids=self.prompt)

    def step(self, turn: ModelTurn) -> StepResult:
        if self.barrier is not None:
            self.barrier.wait()  # only passes when the steps of a round run at once
        if turn.index == self.raise_at:
            raise RuntimeError("the environment broke")
        self.turns.append(turn)
        if DONE in turn.token_ids:
            return StepResult(reward=turn.index + 1, done=True)
        return StepResult(observation_token_ids=self.observation, reward=0.5)


@attrs.define
class Engine:
    """Answers request ``r`` of each call with ``reply(request, sample)``; records every call."""

    reply: Callable[[GenerationRequest, int], tuple[int, ...]]
    calls: list[tuple[list[GenerationRequest], SamplingParams]] = attrs.field(factory=list)

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        self.calls.append((list(requests), params))
        results = []
        for request in requests:
            for sample in range(params.n):
                tokens = self.reply(request, sample)[: params.max_new_tokens]
                results.append(
                    GenerationResult(
                        request_id=request.request_id,
                        sample_index=sample,
                        prompt_token_ids=request.prompt_token_ids,
                        output_token_ids=tokens,
                        finish_reason="stop" if DONE in tokens else "length",
                        logprobs=tuple(-0.1 * t for t in tokens),
                    )
                )
        return results


PARAMS = SamplingParams(max_new_tokens=16, return_logprobs=True)
TASK = EpisodeTask(prompt="p")


def _run(
    engine: Engine,
    budget: EpisodeBudget,
    *,
    params: SamplingParams = PARAMS,
    tasks: Sequence[EpisodeTask] = (TASK,),
    env: Callable[[EpisodeTask], CountingEnv] = lambda _: CountingEnv(),
) -> list[Episode]:
    return run_episodes(tasks, env, engine.generate, params, budget)


def test_the_environment_ends_the_episode() -> None:
    replies = iter([(10, 11), (12, DONE)])
    (episode,) = _run(
        Engine(lambda r, s: next(replies)), EpisodeBudget(max_turns=5, max_total_tokens=100)
    )
    assert episode.end == "done"
    assert episode.response_token_ids == (10, 11, 8, 9, 12, DONE)
    assert episode.model_mask == (True, True, False, False, True, True)
    assert episode.logprobs == pytest.approx((-1.0, -1.1, 0.0, 0.0, -1.2, -0.3))
    assert [t.reward for t in episode.turns] == [0.5, 2.0]
    assert episode.reward == 2.5
    assert [t.observation_length for t in episode.turns] == [2, 0]


def test_max_turns_ends_the_episode_without_its_last_observation() -> None:
    engine = Engine(lambda r, s: (10,))
    (episode,) = _run(engine, EpisodeBudget(max_turns=3, max_total_tokens=100))
    assert episode.end == "max_turns"
    assert episode.response_token_ids == (10, 8, 9, 10, 8, 9, 10)
    assert episode.model_mask[-1]
    assert len(engine.calls) == 3


def test_a_turn_past_the_total_budget_is_cut_to_it() -> None:
    engine = Engine(lambda r, s: (10, 11, 12, 13, 14, 15))
    (episode,) = _run(engine, EpisodeBudget(max_turns=5, max_total_tokens=3 + 6 + 2 + 4))
    assert episode.end == "max_total_tokens"
    assert len(episode.token_ids) == 15
    assert episode.turn_token_ids(1) == (10, 11, 12, 13)  # a prefix of the sample
    assert episode.turns[1].finish_reason == "length"
    assert episode.logprobs is not None
    assert episode.logprobs[-4:] == pytest.approx((-1.0, -1.1, -1.2, -1.3))


def test_each_request_asks_for_what_its_episode_has_left() -> None:
    # The engine honours the per-request limit, so no turn needs cutting.
    def reply(request: GenerationRequest, sample: int) -> tuple[int, ...]:
        limit = request.max_new_tokens or 100
        return (10, 11, 12, 13, 14, 15)[:limit]

    engine = Engine(reply)
    (episode,) = _run(engine, EpisodeBudget(max_turns=5, max_total_tokens=3 + 6 + 2 + 4))
    assert [[r.max_new_tokens for r in requests] for requests, _ in engine.calls] == [[12], [4]]
    # the call's own limit is rank-independent: the round's common one
    assert [p.max_new_tokens for _, p in engine.calls] == [16, 16]
    assert episode.turn_token_ids(1) == (10, 11, 12, 13)
    assert episode.end == "max_total_tokens"


def test_an_observation_that_leaves_no_room_ends_the_episode() -> None:
    # prompt 3 + turn 2 + observation 2 would leave no token for the next turn.
    (episode,) = _run(Engine(lambda r, s: (10, 11)), EpisodeBudget(max_turns=5, max_total_tokens=7))
    assert episode.end == "max_total_tokens"
    assert episode.response_token_ids == (10, 11)
    assert episode.turns[0].observation_length == 0


def test_max_turn_tokens_caps_every_call() -> None:
    engine = Engine(lambda r, s: tuple(range(10, 30)))
    budget = EpisodeBudget(max_turns=2, max_total_tokens=100, max_turn_tokens=4)
    (episode,) = _run(engine, budget)
    assert [p.max_new_tokens for _, p in engine.calls] == [4, 4]
    assert [t.length for t in episode.turns] == [4, 4]


def test_a_group_shares_its_first_request_and_then_runs_apart() -> None:
    def reply(request: GenerationRequest, sample: int) -> tuple[int, ...]:
        context = request.prompt_token_ids
        if len(context) == 3:  # first turn: sample j of the group says 20 + j
            return (20 + sample,) if sample != 1 else (20 + sample, DONE)
        return (30 + context[3] - 20,) if context[3] != 22 else (DONE,)

    engine = Engine(reply)
    params = attrs.evolve(PARAMS, n=3)
    tasks = [EpisodeTask(prompt="a"), EpisodeTask(prompt="b")]
    episodes = _run(
        engine, EpisodeBudget(max_turns=3, max_total_tokens=100), params=params, tasks=tasks
    )
    first_requests, first_params = engine.calls[0]
    assert len(first_requests) == 2
    assert first_params.n == 3
    assert all(p.n == 1 for _, p in engine.calls[1:])
    assert [(e.task_index, e.sample_index) for e in episodes] == [
        (t, s) for t in range(2) for s in range(3)
    ]
    assert [e.turn_token_ids(0) for e in episodes[:3]] == [(20,), (21, DONE), (22,)]
    assert [e.end for e in episodes[:3]] == ["max_turns", "done", "done"]
    # round 1 asks only for the live episodes: samples 0 and 2 of both tasks
    assert len(engine.calls[1][0]) == 4


def test_a_prompt_that_fills_the_budget_is_refused_before_generating() -> None:
    engine = Engine(lambda r, s: (10,))
    with pytest.raises(EpisodeError, match="prompt has 3 tokens, which leaves no room"):
        _run(engine, EpisodeBudget(max_turns=2, max_total_tokens=3))
    assert engine.calls == []


def test_an_environment_that_raises_is_named() -> None:
    with pytest.raises(
        EpisodeError, match=r"episode 0 of task 0 \('t7'\).*step of turn 1 raised RuntimeError"
    ):
        _run(
            Engine(lambda r, s: (10,)),
            EpisodeBudget(max_turns=4, max_total_tokens=100),
            tasks=[EpisodeTask(prompt="p", task_id="t7")],
            env=lambda _: CountingEnv(raise_at=1),
        )


def test_a_group_whose_resets_differ_is_refused() -> None:
    prompts = iter([(5,), (6,)])
    with pytest.raises(EpisodeError, match="reset gave another prompt"):
        _run(
            Engine(lambda r, s: (10,)),
            EpisodeBudget(max_turns=2, max_total_tokens=100),
            params=attrs.evolve(PARAMS, n=2),
            env=lambda _: CountingEnv(prompt=next(prompts)),
        )


def test_every_rank_calls_generate_alike_while_any_has_live_episodes() -> None:
    """Two ranks as threads; ``any_live`` is an all-reduce (max) over them."""
    ranks = 2
    barrier = threading.Barrier(ranks, timeout=10)
    votes: list[bool] = [False] * ranks
    lock = threading.Lock()

    def any_live_for(rank: int) -> Callable[[bool], bool]:
        def any_live(live_here: bool) -> bool:
            with lock:
                votes[rank] = live_here
            barrier.wait()
            agreed = any(votes)
            barrier.wait()
            return agreed

        return any_live

    # rank 0's episodes end after one turn, rank 1's after three
    engines = [
        Engine(lambda r, s: (DONE,)),
        Engine(lambda r, s: (10,) if len(r.prompt_token_ids) < 9 else (DONE,)),
    ]
    outputs: list[list[Episode]] = [[], []]

    def rank(index: int) -> None:
        outputs[index] = run_episodes(
            [TASK, TASK],
            lambda _: CountingEnv(),
            engines[index].generate,
            PARAMS,
            EpisodeBudget(max_turns=5, max_total_tokens=100),
            any_live=any_live_for(index),
        )

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(ranks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert [len(e.calls) for e in engines] == [3, 3]
    assert [len(requests) for requests, _ in engines[0].calls] == [2, 0, 0]
    assert [p for _, p in engines[0].calls] == [p for _, p in engines[1].calls]
    assert [e.end for e in outputs[0] + outputs[1]] == ["done"] * 4
    assert [len(e.turns) for e in outputs[1]] == [3, 3]


def test_steps_of_a_round_run_concurrently_with_max_workers() -> None:
    barrier = threading.Barrier(4, timeout=10)
    episodes = run_episodes(
        [TASK] * 4,
        lambda _: CountingEnv(barrier=barrier),
        Engine(lambda r, s: (DONE,)).generate,
        PARAMS,
        EpisodeBudget(max_turns=2, max_total_tokens=100),
        max_workers=4,
    )
    assert [e.end for e in episodes] == ["done"] * 4


def test_episode_tensors_mask_only_the_model_tokens() -> None:
    replies = iter([(10, 11), (DONE,), (12, DONE)])  # round 0: both episodes; round 1: the first
    tasks = [TASK, TASK]
    episodes = _run(
        Engine(lambda r, s: next(replies)),
        EpisodeBudget(max_turns=5, max_total_tokens=100),
        tasks=tasks,
    )
    batch = episode_tensors(episodes, pad_id=0)
    assert batch.input_ids.tolist() == [
        [5, 6, 7, 10, 11, 8, 9, 12, DONE],
        [5, 6, 7, DONE, 0, 0, 0, 0, 0],
    ]
    assert batch.attention_mask.tolist() == [[1] * 9, [1] * 4 + [0] * 5]
    assert batch.prompt_lengths.tolist() == [3, 3]
    assert batch.response_lengths.tolist() == [6, 1]
    assert batch.action_mask.tolist() == [
        [True, True, False, False, True, True],
        [True, False, False, False, False, False],
    ]
    assert batch.response_tokens.tolist() == [[10, 11, 8, 9, 12, DONE], [DONE, 0, 0, 0, 0, 0]]
    assert batch.turn_index.tolist() == [[0, 0, -1, -1, 1, 1], [0, -1, -1, -1, -1, -1]]
    assert batch.token_rewards.tolist() == [[0, 0.5, 0, 0, 0, 2.0], [1.0, 0, 0, 0, 0, 0]]
    assert batch.engine_logprobs is not None
    expected = [[-1.0, -1.1, 0, 0, -1.2, -0.3], [-0.3, 0, 0, 0, 0, 0]]
    assert torch.allclose(batch.engine_logprobs, torch.tensor(expected))
