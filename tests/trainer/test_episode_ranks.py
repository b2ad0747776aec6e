"""Multi-turn rollouts on two gloo ranks: every rank calls the engine in every round.

Rank 0's episodes end after one turn, rank 1's after three. Through the trainer's episode
rollout (the experience maker's TP-group generate, the ``any_live`` all-reduce), rank 0 keeps
calling generate, with no requests of its own, until rank 1's episodes end. Recording engines
stand in for real ones: what is checked is what each engine was given, round by round.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
import torch.distributed as dist
from transformers import PreTrainedTokenizerBase

from lrft.agents import EnvironmentSetup
from lrft.agents.registry import environments
from lrft.api import EngineCapabilities, GenerationRequest, GenerationResult, SamplingParams
from lrft.api.episodes import EpisodeBudget, EpisodeStart, EpisodeTask, ModelTurn, StepResult
from lrft.api.protocols import RolloutEngine
from lrft.data import PromptSample
from lrft.dist import RolloutLayout
from lrft.rewards import PerSampleReward
from lrft.testing.distributed import DistributedSuite, RankPool, current_rank_context
from lrft.trainer.episodes import EpisodeRunner
from lrft.trainer.experience import ExperienceMaker

OBSERVATION = 7


class _Countdown:
    """An episode of as many turns as its prompt text says; observation 7 between them."""

    def __init__(self, setup: EnvironmentSetup) -> None:
        self.turns = 0

    def reset(self, task: EpisodeTask) -> EpisodeStart:
        assert isinstance(task.prompt, str)
        self.turns = int(task.prompt)
        return EpisodeStart(prompt_token_ids=(int(task.task_id) + 1,))

    def step(self, turn: ModelTurn) -> StepResult:
        if turn.index + 1 >= self.turns:
            return StepResult(reward=1.0, done=True)
        return StepResult(observation_token_ids=(OBSERVATION,))


class _RecordingEngine:
    """A single-rank engine answering each request with token 3; records every batch."""

    capabilities = EngineCapabilities(max_tp=1)

    def __init__(self) -> None:
        self.batches: list[list[tuple[int, ...]]] = []

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        self.batches.append([r.prompt_token_ids for r in requests])
        return [
            GenerationResult(
                request_id=r.request_id,
                sample_index=sample,
                prompt_token_ids=r.prompt_token_ids,
                output_token_ids=(3,),
                finish_reason="stop",
            )
            for r in requests
            for sample in range(params.n)
        ]


def _rounds(tp_size: int) -> tuple[list[list[tuple[int, ...]]], list[tuple[int, ...]]]:
    if "countdown" not in environments.names():
        environments.register("countdown", _Countdown)
    rank = current_rank_context().rank
    group = None
    if tp_size > 1:
        group = RolloutLayout(world_size=2, tp_size=tp_size).build_groups().tp_group
    engine = _RecordingEngine()
    maker = ExperienceMaker(
        engine=cast(RolloutEngine, engine),
        decode=str,
        reward=PerSampleReward(name="zero", score=lambda _: 0.0),
        sampling=SamplingParams(n=1, max_new_tokens=4),
        estimator="reinforce",
        micro_batch_size=4,
        device=torch.device("cpu"),
        tp_group=group,
    )
    rollout = EpisodeRunner(
        environment="countdown",
        setup=EnvironmentSetup(tokenizer=cast(PreTrainedTokenizerBase, None)),
        budget=EpisodeBudget(max_turns=5, max_total_tokens=64),
        generate=maker.generate_requests,
        device=torch.device("cpu"),
    )
    turns = "1" if rank == 0 else "3"
    prompts = [
        PromptSample(
            prompt_text=turns, prompt_token_ids=(1,), raw_input=turns, source_index=10 * rank
        )
    ]
    batch = rollout.run(prompts, maker.sampling)
    dist.barrier()
    return engine.batches, [e.token_ids for e in batch.episodes]


class TestEpisodesOnTwoRanks(DistributedSuite):
    world_size = 2

    def test_a_rank_whose_episodes_ended_still_calls_the_engine(self, pool: RankPool) -> None:
        (given0, got0), (given1, got1) = pool.run(_rounds, 1)
        assert given0 == [[(1,)], [], []]
        assert given1 == [[(11,)], [(11, 3, OBSERVATION)], [(11, 3, OBSERVATION, 3, OBSERVATION)]]
        assert got0 == [(1, 3)]
        assert got1 == [(11, 3, OBSERVATION, 3, OBSERVATION, 3)]

    def test_a_single_rank_engine_of_a_tp_group_gets_the_groups_requests(
        self, pool: RankPool
    ) -> None:
        (given0, got0), (given1, got1) = pool.run(_rounds, 2)
        expected = [
            [(1,), (11,)],
            [(11, 3, OBSERVATION)],
            [(11, 3, OBSERVATION, 3, OBSERVATION)],
        ]
        assert given0 == given1 == expected
        assert got0 == [(1, 3)]
        assert got1 == [(11, 3, OBSERVATION, 3, OBSERVATION, 3)]
