"""``RolloutLayoutSuite[E]``: TP/DP process groups and TP-group generation on real collectives.

The pure-data properties of ``RolloutLayout`` are unit tests (``tests/unit/test_layout.py``);
this suite checks what needs processes: the groups ``build_groups`` creates hold the ranks the
layout says (an all-reduce over each sums exactly those ranks), and ``tp_group_generate`` hands
each rank exactly its own results, in order, equal to a plain greedy reference. Ranks send
different numbers of requests so that an off-by-one in the slicing cannot hide.
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import ClassVar, Generic, TypeVar

import pytest
import torch
import torch.distributed as dist

from lrft.api import GenerationRequest, RolloutEngine, SamplingParams
from lrft.dist import RolloutLayout, tp_group_generate
from lrft.testing.distributed import DistributedSuite, RankPool, current_rank_context
from lrft.testing.models import save_tiny_causal_lm
from lrft.testing.reference import greedy_continuation, load_reference_model

E = TypeVar("E", bound=RolloutEngine)

NEW_TOKENS = 8


class RolloutLayoutSuite(DistributedSuite, abc.ABC, Generic[E]):
    """Run at ``world_size`` ranks with TP groups of ``tp_size``."""

    tp_size: ClassVar[int] = 2

    @classmethod
    @abc.abstractmethod
    def make_engine(cls, model_dir: Path) -> E:
        """An engine serving ``model_dir`` on this rank's device (called inside a rank)."""

    @pytest.fixture(scope="class")
    @classmethod
    def model_dir(cls, tmp_path_factory: pytest.TempPathFactory) -> Path:
        return save_tiny_causal_lm(tmp_path_factory.mktemp("layout-model"), seed=0)

    def test_groups_hold_the_layout_ranks(self, pool: RankPool) -> None:
        pool.run(_check_groups, self.tp_size)

    def test_tp_group_generate_gives_each_rank_its_own_results(
        self, pool: RankPool, model_dir: Path
    ) -> None:
        pool.run(_check_tp_generate, type(self), model_dir)


def _rank_sum(group: dist.ProcessGroup) -> int:
    ctx = current_rank_context()
    value = torch.tensor([ctx.rank], dtype=torch.int64, device=ctx.device)
    dist.all_reduce(value, group=group)
    return int(value.item())


def _check_groups(tp_size: int) -> None:
    ctx = current_rank_context()
    layout = RolloutLayout(world_size=ctx.world_size, tp_size=tp_size)
    groups = layout.build_groups()
    where = f"rank {ctx.rank} of {layout}"
    assert groups.tp_ranks == layout.tp_group_of(ctx.rank), (
        f"{where}: build_groups() gives TP ranks {groups.tp_ranks}, the layout says "
        f"{layout.tp_group_of(ctx.rank)}"
    )
    sizes = (dist.get_world_size(groups.tp_group), dist.get_world_size(groups.dp_group))
    assert sizes == (tp_size, layout.dp_size), (
        f"{where}: the TP and DP groups have {sizes} ranks, the layout says "
        f"{(tp_size, layout.dp_size)}"
    )
    # a group's all-reduce sums exactly its members: proves the group has the ranks it claims
    for kind, group, members in (
        ("TP", groups.tp_group, layout.tp_group_of(ctx.rank)),
        ("DP", groups.dp_group, layout.dp_group_of(ctx.rank)),
    ):
        total = _rank_sum(group)
        assert total == sum(members), (
            f"{where}: an all-reduce of the ranks over its {kind} group sums to {total}, but the "
            f"layout's members {members} sum to {sum(members)}"
        )


def _own_prompts(rank: int) -> list[tuple[int, ...]]:
    # rank r sends r + 1 prompts of different lengths, unique to it
    return [tuple(range(10 + 7 * rank + i, 14 + 7 * rank + 2 * i)) for i in range(rank + 1)]


def _check_tp_generate(suite: type[RolloutLayoutSuite[E]], model_dir: Path) -> None:
    ctx = current_rank_context()
    layout = RolloutLayout(world_size=ctx.world_size, tp_size=suite.tp_size)
    groups = layout.build_groups()
    prompts = _own_prompts(ctx.rank)
    requests = [
        GenerationRequest(prompt_token_ids=p, request_id=f"rank{ctx.rank}-{i}")
        for i, p in enumerate(prompts)
    ]
    params = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS, n=2)
    with suite.make_engine(model_dir) as engine:
        results = tp_group_generate(engine.generate, requests, params, groups.tp_group)
    got = [(r.request_id, r.sample_index) for r in results]
    want = [(q.request_id, sample) for q in requests for sample in range(2)]
    assert got == want, (
        f"rank {ctx.rank}: tp_group_generate gave results (request id, sample) {got}, its own "
        f"requests are {want}"
    )
    reference = load_reference_model(model_dir, ctx.device)
    for index, result in enumerate(results):
        prompt = prompts[index // 2]
        assert result.prompt_token_ids == prompt, (
            f"rank {ctx.rank} result {index} has prompt {result.prompt_token_ids}, not {prompt}"
        )
        expected = tuple(greedy_continuation(reference, prompt, NEW_TOKENS))
        assert result.output_token_ids == expected, (
            f"rank {ctx.rank} result {index}: {result.output_token_ids} != reference {expected}"
        )
