"""Which engines the trainer's generate gathers a TP group's prompts for, on two gloo ranks.

An engine declaring ``tensor_parallel`` spans its TP group and gathers the group's requests
itself (the ``RolloutEngine`` contract): the trainer hands it only this rank's prompts. A
single-rank engine gets the whole group's prompts through ``tp_group_generate`` and each rank
keeps its own results. Recording engines stand in for real ones: what is checked is what each
engine was given.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
import torch.distributed as dist

from lrft.api import EngineCapabilities, GenerationRequest, GenerationResult, SamplingParams
from lrft.api.protocols import RolloutEngine
from lrft.data import PromptSample
from lrft.dist import RolloutLayout
from lrft.rewards import PerSampleReward
from lrft.testing.distributed import DistributedSuite, RankPool, current_rank_context
from lrft.trainer.experience import ExperienceMaker


class _RecordingEngine:
    """Answers each request with its own first token and records every batch it was given."""

    def __init__(self, max_tp: int) -> None:
        self.capabilities = EngineCapabilities(max_tp=max_tp)
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
                output_token_ids=r.prompt_token_ids[:1],
                finish_reason="length",
            )
            for r in requests
            for sample in range(params.n)
        ]


def _given_and_returned(max_tp: int) -> tuple[list[list[tuple[int, ...]]], list[tuple[int, ...]]]:
    rank = current_rank_context().rank
    group = RolloutLayout(world_size=2, tp_size=2).build_groups().tp_group
    engine = _RecordingEngine(max_tp)
    maker = ExperienceMaker(
        engine=cast(RolloutEngine, engine),
        decode=str,
        reward=PerSampleReward(name="zero", score=lambda _: 0.0),
        sampling=SamplingParams(n=2, max_new_tokens=1),
        estimator="group_norm",
        micro_batch_size=4,
        device=torch.device("cpu"),
        tp_group=group,
    )
    # ranks hold different numbers of prompts, so a wrong slice cannot pass
    prompts = [
        PromptSample(prompt_text="", prompt_token_ids=(10 * rank + i + 1,), source_index=i)
        for i in range(rank + 1)
    ]
    results = maker.generate(prompts, maker.sampling)
    dist.barrier()
    return engine.batches, [r.prompt_token_ids for r in results]


class TestTPGenerateOnTwoRanks(DistributedSuite):
    world_size = 2

    def test_an_engine_spanning_the_group_gets_only_its_ranks_prompts(self, pool: RankPool) -> None:
        (given0, got0), (given1, got1) = pool.run(_given_and_returned, 2)
        assert given0 == [[(1,)]]
        assert given1 == [[(11,), (12,)]]
        assert got0 == [(1,), (1,)]
        assert got1 == [(11,), (11,), (12,), (12,)]

    def test_a_single_rank_engine_gets_the_groups_prompts(self, pool: RankPool) -> None:
        (given0, got0), (given1, got1) = pool.run(_given_and_returned, 1)
        assert given0 == given1 == [[(1,), (11,), (12,)]]
        assert got0 == [(1,), (1,)]
        assert got1 == [(11,), (11,), (12,), (12,)]
