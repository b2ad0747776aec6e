"""A tensor-parallel engine built the way a third-party author would on lrft's own helper: the hf
engine on every rank of a TP group, its ``generate`` made collective over the group by
``lrft.dist.tp_group_generate``. It passes the whole ``RolloutEngineSuite`` at TP 2, in seconds:
the suite passes every rank of a group equal ``SamplingParams``, and the helper refuses unequal
ones on every rank alike instead of leaving a rank waiting."""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

import attrs
import pytest
import torch
import torch.distributed as dist

from lrft.api import (
    EngineCapabilities,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    LrftError,
    SamplingParams,
)
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.dist import RolloutLayout, all_gather_objects, tp_group_generate
from lrft.models.media import load_generative_model
from lrft.testing.conformance import rollout as checks
from lrft.testing.conformance.expect import raises
from lrft.testing.conformance.rollout import RolloutEngineSuite, make_engine_models
from lrft.testing.distributed import (
    DistributedSuite,
    RankFailure,
    RankPool,
    current_rank_context,
    shared_pool,
)
from lrft.testing.models import save_tiny_causal_lm


class HelperTPEngine(HFRolloutEngine):
    """The hf engine on every rank of a TP group of ``tp_size``, generating the group's requests
    together through ``tp_group_generate``. Building it is collective (it creates the groups)."""

    def __init__(
        self, model: torch.nn.Module, *, config: HFEngineConfig | None = None, tp_size: int = 2
    ) -> None:
        super().__init__(model, config=config)
        layout = RolloutLayout(world_size=dist.get_world_size(), tp_size=tp_size)
        self._tp_group = layout.build_groups().tp_group
        self._tp_size = tp_size

    @property
    def capabilities(self) -> EngineCapabilities:
        return attrs.evolve(super().capabilities, max_tp=self._tp_size)

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        return tp_group_generate(super().generate, requests, params, self._tp_group)


class TestHelperTPEngineWorld2(RolloutEngineSuite[HelperTPEngine]):
    world_size = 2
    tp_size = 2
    engine_class: ClassVar[type[HelperTPEngine]] = HelperTPEngine

    @classmethod
    def make_engine(cls, model_dir: Path, device: torch.device) -> HelperTPEngine:
        model = load_generative_model(model_dir, dtype="auto")
        config = HFEngineConfig(device=device)
        return cls.engine_class(model, config=config, tp_size=cls.tp_size)

    @classmethod
    def read_engine_weights(cls, engine: HelperTPEngine) -> Mapping[str, torch.Tensor]:
        return dict(engine.model.named_parameters())


def _unequal_params_refused() -> float:
    """Each rank of one TP group passes another seed: every rank raises, at once."""
    rank = current_rank_context().rank
    group = RolloutLayout(world_size=dist.get_world_size(), tp_size=2).build_groups().tp_group
    request = GenerationRequest(prompt_token_ids=(5, 6, 7), request_id=f"rank{rank}")
    start = time.monotonic()
    with raises(LrftError, "tp_group_generate with a seed per rank", match="rank 1 passed seed 1"):
        tp_group_generate(lambda requests, params: [], [request], SamplingParams(seed=rank), group)
    return time.monotonic() - start


class TestTPGroupParams(DistributedSuite):
    world_size = 2

    def test_unequal_params_are_refused_on_every_rank_at_once(self, pool: RankPool) -> None:
        seconds = pool.run(_unequal_params_refused)
        assert max(seconds) < 5.0, f"refusing took {seconds} s"

    def test_a_check_that_passes_unequal_params_fails_in_seconds(self, pool: RankPool) -> None:
        start = time.monotonic()
        with pytest.raises(RankFailure, match=r"passed different SamplingParams"):
            pool.run(_ranks_pass_their_own_seed, TestHelperTPEngineWorld2)
        assert time.monotonic() - start < 30.0


def _ranks_pass_their_own_seed(suite: type[TestHelperTPEngineWorld2]) -> None:
    context = current_rank_context()
    folder = context.shared_dir / "tp-params-model"
    if context.rank == 0 and not folder.exists():
        save_tiny_causal_lm(folder)
    dist.barrier()
    with suite.make_engine(folder, context.device) as engine:
        request = GenerationRequest(prompt_token_ids=(5, 6, 7), request_id="r")
        engine.generate([request], SamplingParams(max_new_tokens=2, seed=context.rank))


class SharedLogitsTPEngine(HelperTPEngine):
    """A TP engine as an SPMD one computes: the ranks of a group decode the group's rows
    together, each step's logits the mean of what every rank computes (as the partial results
    of row-parallel layers are added), and each rank samples every row's next token itself.
    Unseeded, it seeds its sampler from the OS, so each rank draws other tokens (the fault);
    ``draws_alike`` takes rank 0's draw instead, as a correct engine must."""

    draws_alike: ClassVar[bool] = False

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        self._lifecycle.check_can_generate(requests)
        per_rank = all_gather_objects(list(requests), self._tp_group)
        everything = [request for own in per_rank for request in own]
        seed = params.seed if params.seed is not None else secrets.randbits(31)
        if self.draws_alike:
            seed = all_gather_objects(seed, self._tp_group)[0]
        generator = torch.Generator().manual_seed(seed)
        rows = [request for request in everything for _ in range(params.n)]
        decoded = [self._decode(request, params, generator) for request in rows]
        me = dist.get_rank(self._tp_group)
        start = sum(len(own) for own in per_rank[:me]) * params.n
        return [
            GenerationResult(
                request_id=request.request_id,
                sample_index=index % params.n,
                prompt_token_ids=request.prompt_token_ids,
                output_token_ids=tokens,
                finish_reason=reason,
                logprobs=logprobs if params.return_logprobs else None,
            )
            for index, (request, (tokens, reason, logprobs)) in enumerate(
                zip(rows[start:], decoded[start:], strict=False)
            )
            if index < len(requests) * params.n
        ]

    @torch.no_grad()
    def _decode(
        self, request: GenerationRequest, params: SamplingParams, generator: torch.Generator
    ) -> tuple[tuple[int, ...], FinishReason, tuple[float, ...]]:
        capped = request.capped(params)
        ids, logprobs = list(request.prompt_token_ids), []
        for step in range(capped.max_new_tokens):
            logits = self.model(torch.tensor([ids])).logits[0, -1].float()
            dist.all_reduce(logits, group=self._tp_group)
            scores = logits / self._tp_size / (params.temperature or 1.0)
            allowed = scores.clone()
            if step < capped.min_new_tokens and capped.stop_token_ids:
                allowed[list(capped.stop_token_ids)] = float("-inf")
            if params.greedy:
                token = int(allowed.argmax())
            else:
                token = int(torch.multinomial(allowed.softmax(-1), 1, generator=generator))
            ids.append(token)
            logprobs.append(float(scores.log_softmax(-1)[token]))
            if token in capped.stop_token_ids:
                return tuple(ids[len(request.prompt_token_ids) :]), "stop", tuple(logprobs)
        return tuple(ids[len(request.prompt_token_ids) :]), "length", tuple(logprobs)


class SharedLogitsSuite(TestHelperTPEngineWorld2):
    engine_class = SharedLogitsTPEngine


class DrawsAlike(SharedLogitsTPEngine):
    draws_alike = True


class DrawsAlikeSuite(TestHelperTPEngineWorld2):
    engine_class = DrawsAlike


class TestTPDivergence(DistributedSuite):
    world_size = 2

    def test_ranks_that_draw_other_tokens_without_a_seed_fail(
        self, pool: RankPool, tmp_path_factory: pytest.TempPathFactory
    ) -> None:
        models = make_engine_models(tmp_path_factory.mktemp("tp-divergence-models"))
        # seeded, the ranks draw alike: the sampled-logprob check passes
        SharedLogitsSuite().run_check(pool, checks.check_sampled_logprobs, models)
        DrawsAlikeSuite().run_check(pool, checks.check_unseeded_sampling, models)
        with pytest.raises(
            RankFailure,
            match=r"sampled with no seed: request 'r\d' sample \d: token \d+ \(id \d+\) of .* has "
            r"logprob .*, the reference log_softmax\(logits / 0\.7\) of the unmasked "
            r"distribution gives",
        ):
            SharedLogitsSuite().run_check(pool, checks.check_unseeded_sampling, models)


class WrongOnRankOne(HelperTPEngine):
    """Hands rank 1 its greedy tokens reversed (an off-by-one in a TP engine's slicing hurts
    one rank's requests only)."""

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        results = super().generate(requests, params)
        if dist.get_rank() != 1:
            return results
        return [attrs.evolve(r, output_token_ids=r.output_token_ids[::-1]) for r in results]


class WrongOnRankOneSuite(TestHelperTPEngineWorld2):
    engine_class = WrongOnRankOne


def test_a_state_machine_failing_on_one_rank_fails_every_rank_at_once(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Hypothesis shrinks a failing run with more engine calls, which are collective for a TP
    engine: the other rank's machine stops at the same step and says so, rather than waiting in
    a collective (then reported as hung and its pool killed, or, had it finished first, leaving
    the failing rank to wait until the pool's timeout)."""
    models = make_engine_models(tmp_path_factory.mktemp("one-rank-models"))
    start = time.monotonic()
    with pytest.raises(
        RankFailure,
        match=r"(?s)rank 0 raised AssertionError: generate failed on another rank.*rank 1 raised "
        r"AssertionError: greedy tokens of the prompts",
    ):
        WrongOnRankOneSuite().run_check(
            shared_pool(2), checks.check_lifecycle_state_machine, models
        )
    assert time.monotonic() - start < 120.0
