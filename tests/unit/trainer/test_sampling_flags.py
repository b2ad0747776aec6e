"""The experience-side flags of ``lrft train``: FIRE sampling (two engine calls, joined; the
trainer's logprobs at the same temperatures as the engine's), truncated importance sampling (the
engine's logprobs asked for and carried), overlong shaping, and DAPO dynamic sampling with refill
(groups dropped and replaced, counts, the sampler position)."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import pytest
import torch

from lrft.algo import (
    AdvantageParams,
    RewardBatch,
    compute_advantages,
    dynamic_sampling_filter,
    group_ids_from_size,
    overlong_penalty,
)
from lrft.api.types import GenerationRequest, GenerationResult, SamplingParams
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.cli import config_from_args
from lrft.data import DistributedPromptSampler, PromptSample
from lrft.rewards import PerSampleReward, RewardOutput
from lrft.testing.models import tiny_causal_lm
from lrft.trainer.experience import ExperienceMaker, pack_engine_logprobs
from lrft.trainer.rollout_stack import experience_maker, rollout_sampling
from lrft.trainer.sampling import ScoredGroups, continuation_seed, refill_groups
from lrft.trainer.sequences import pack

MODEL = ["train", "--pretrain=m", "--prompt_data=p.jsonl", "--reward_fn=math"]
CPU = torch.device("cpu")
EOS = 2


def _maker(flags: list[str], engine: object = None) -> ExperienceMaker:
    config = config_from_args([*MODEL, *flags])
    return experience_maker(
        config,
        engine=engine,  # type: ignore[arg-type]  # a stand-in, or unused by the code under test
        decode=lambda ids: " ".join(map(str, ids)),
        reward=PerSampleReward(name="zero", score=lambda sample: 0.0),
        device=CPU,
        tp_group=None,
        eos_token_id=EOS,
    )


def _prompt(index: int, ids: Sequence[int] = (5, 6)) -> PromptSample:
    return PromptSample(prompt_text=f"p{index}", prompt_token_ids=list(ids), source_index=index)


# --- FIRE -------------------------------------------------------------------------------------


class _NoCapabilities:
    def names(self) -> tuple[str, ...]:
        return ()


class _ScriptedEngine:
    """Records each call; sample ``j`` of a first-token call emits ``10 + j`` (EOS for prompts
    starting with 9), a continuation emits ``20, 21, ...``; each logprob is minus the call's
    temperature, so the joined results show which call sampled which token."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[tuple[int, ...]], SamplingParams]] = []

    @property
    def capabilities(self) -> _NoCapabilities:
        return _NoCapabilities()

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        self.calls.append(([r.prompt_token_ids for r in requests], params))
        results = []
        for request in requests:
            for j in range(params.n):
                if params.max_new_tokens == 1:
                    tokens = [EOS if request.prompt_token_ids[0] == 9 else 10 + j]
                else:
                    tokens = list(range(20, 20 + params.max_new_tokens))
                results.append(
                    GenerationResult(
                        request_id=request.request_id,
                        sample_index=j,
                        prompt_token_ids=request.prompt_token_ids,
                        output_token_ids=tokens,
                        finish_reason="stop" if tokens == [EOS] else "length",
                        logprobs=(-params.temperature,) * len(tokens),
                    )
                )
        return results


def test_fire_samples_the_first_token_hot_and_continues_each_sample() -> None:
    engine = _ScriptedEngine()
    maker = _maker(
        ["--use_fire_sampling", "--fire_first_token_temperature=7", "--temperature=0.5"], engine
    )
    params = attrs.evolve(maker.sampling, n=2, max_new_tokens=3, seed=11, return_logprobs=True)
    results = maker.generate([_prompt(0, (5, 6)), _prompt(1, (9,))], params)

    (first_prompts, first), (rest_prompts, rest) = engine.calls
    assert first_prompts == [(5, 6), (9,)]
    assert (first.n, first.temperature, first.max_new_tokens) == (2, 7.0, 1)
    # prompt 1's first tokens were EOS: only prompt 0's two samples are continued, one each
    assert rest_prompts == [(5, 6, 10), (5, 6, 11)]
    assert (rest.n, rest.temperature, rest.max_new_tokens) == (1, 0.5, 2)
    assert rest.seed == continuation_seed(11) != 11
    assert [r.output_token_ids for r in results] == [(10, 20, 21), (11, 20, 21), (EOS,), (EOS,)]
    assert [r.prompt_token_ids for r in results] == [(5, 6), (5, 6), (9,), (9,)]
    assert [r.sample_index for r in results] == [0, 1, 0, 1]
    assert results[0].logprobs == (-7.0, -0.5, -0.5)
    assert [r.finish_reason for r in results] == ["length", "length", "stop", "stop"]


def test_fire_is_off_for_greedy_evaluation_and_without_the_flag() -> None:
    engine = _ScriptedEngine()
    maker = _maker(["--use_fire_sampling"], engine)
    maker.generate([_prompt(0)], attrs.evolve(maker.sampling, temperature=0.0, n=1))
    assert len(engine.calls) == 1
    assert maker.first_token_temperature == 10.0  # the documented default
    assert _maker([]).first_token_temperature is None


class _Frozen:
    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module


def test_fire_logprobs_of_engine_and_trainer_agree() -> None:
    """The hf engine's logprobs of a FIRE rollout equal the trainer's under FIRE, token by
    token, and differ from the trainer's without FIRE at the first token only."""
    engine = HFRolloutEngine(tiny_causal_lm(4), config=HFEngineConfig(device=CPU))
    flags = ["--use_fire_sampling", "--fire_first_token_temperature=2.5", "--temperature=0.7"]
    maker = _maker([*flags, "--use_tis", "--generate_max_len=5"], engine)
    params = attrs.evolve(maker.sampling, n=3, seed=5)
    results = maker.generate([_prompt(0, (5, 6, 7)), _prompt(1, (8,))], params)
    sequences = pack(results)
    engine_logprobs = pack_engine_logprobs(results, sequences.action_mask.shape[1])
    trainer = maker.logprobs(_Frozen(tiny_causal_lm(4)), sequences)  # type: ignore[arg-type]
    torch.testing.assert_close(trainer, engine_logprobs, atol=1e-4, rtol=0)
    plain = attrs.evolve(maker, first_token_temperature=None)
    unfired = plain.logprobs(_Frozen(tiny_causal_lm(4)), sequences)  # type: ignore[arg-type]
    torch.testing.assert_close(unfired[:, 1:], engine_logprobs[:, 1:], atol=1e-4, rtol=0)
    assert (unfired[:, 0] - engine_logprobs[:, 0]).abs().min() > 1e-3


# --- truncated importance sampling --------------------------------------------------------------


def test_tis_asks_the_engine_for_logprobs_and_carries_them() -> None:
    config = config_from_args([*MODEL, "--use_tis"])
    assert rollout_sampling(config, EOS).return_logprobs
    assert not rollout_sampling(config_from_args(MODEL), EOS).return_logprobs
    results = [
        GenerationResult(
            request_id="r",
            sample_index=i,
            prompt_token_ids=(5,),
            output_token_ids=(7,) * (i + 1),
            finish_reason="length",
            logprobs=(-0.5 * (i + 1),) * (i + 1),
        )
        for i in range(3)
    ]
    sequences = pack(results)
    values = pack_engine_logprobs(results, 3)
    assert values.tolist() == [[-0.5, 0, 0], [-1.0, -1.0, 0], [-1.5, -1.5, -1.5]]
    maker = _maker(["--use_tis", "--n_samples_per_prompt=3", "--train_batch_size=96"])
    zeros = torch.zeros(3, 3)
    batch = maker.make(
        sequences, torch.tensor([0.0, 1.0, 0.0]), zeros, None, engine_logprobs=values
    )
    picked = batch.select(torch.tensor([2, 0]))
    assert picked.engine_logprobs is not None
    assert picked.engine_logprobs.tolist() == [[-1.5, -1.5, -1.5], [-0.5, 0, 0]]
    with pytest.raises(ValueError, match=r"result 0 .* no logprobs"):
        pack_engine_logprobs([attrs.evolve(results[0], logprobs=None)], 1)


# --- overlong shaping ---------------------------------------------------------------------------


def test_overlong_shaping_adds_dapos_penalty_to_the_rewards() -> None:
    flags = ["--generate_max_len=6", "--overlong_buffer_len=3", "--overlong_penalty_factor=0.5"]
    maker = _maker(
        [*flags, "--n_samples_per_prompt=5", "--rollout_batch_size=16", "--train_batch_size=80"]
    )
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0])
    lengths = torch.tensor([2, 3, 4, 5, 6])
    shaped = maker.shape(scores, lengths)
    # lengths beyond 6 - 3 = 3 lose 0.5 x (length - 3) / 3
    assert shaped.tolist() == pytest.approx([1.0, 1.0, -1 / 6, 1 - 2 / 6, -0.5])
    want = overlong_penalty(lengths, max_len=6, buffer_len=3, penalty_factor=0.5)
    torch.testing.assert_close(shaped, scores + want)
    assert _maker(["--generate_max_len=6", "--overlong_buffer_len=3"]).overlong_penalty_factor == 1
    assert torch.equal(_maker([]).shape(scores, lengths), scores)
    # the advantages are the estimator's of the shaped rewards
    mask = torch.arange(6)[None, :] < lengths[:, None]
    results = [
        GenerationResult(
            request_id="r",
            sample_index=i,
            prompt_token_ids=(5,),
            output_token_ids=(7,) * int(n),
            finish_reason="length",
        )
        for i, n in enumerate(lengths)
    ]
    batch = maker.make(pack(results), shaped, torch.zeros(5, 6), None)
    reference = compute_advantages(
        "group_norm",
        RewardBatch.from_sequence_rewards(shaped, mask, group_size=5),
        AdvantageParams(),
    )
    torch.testing.assert_close(batch.advantages, reference.advantages.float())


# --- dynamic sampling ---------------------------------------------------------------------------

SPREAD = {1, 2, 4, 6, 7}
"""Prompts (by dataset index) whose responses score differently; the others all score 1."""


def _roll_out(sampler: DistributedPromptSampler, n: int, seen: list[int]) -> ScoredGroups:
    indices = sampler.next_batch().indices
    seen.extend(indices)
    prompts = [_prompt(i) for i in indices]
    results = [
        GenerationResult(
            request_id=str(i),
            sample_index=j,
            prompt_token_ids=(5, 6),
            output_token_ids=(7,),
            finish_reason="stop",
        )
        for i in indices
        for j in range(n)
    ]
    scores = [float(j % 2 if i in SPREAD else 1) for i in indices for j in range(n)]
    rewards = RewardOutput(
        scores=scores, metrics={"index": [float(i) for i in indices for _ in range(n)]}
    )
    return ScoredGroups(
        prompts=prompts, results=results, rewards=rewards, shaped=torch.tensor(scores)
    )


def _sampler(seed: int = 3) -> DistributedPromptSampler:
    return DistributedPromptSampler(
        num_samples=12, global_batch_size=4, rank=0, world_size=1, seed=seed, shuffle=False
    )


def test_refill_replaces_dropped_groups_from_further_prompts() -> None:
    sampler, seen = _sampler(), list[int]()
    refill = refill_groups(
        lambda _: _roll_out(sampler, 2, seen), max_rounds=4, global_sum=lambda v: v
    )
    # unshuffled: rounds take prompts 0-3 (spread: 1, 2), then 4-7 (spread: 4, 6, 7)
    assert seen == list(range(8))
    assert [p.source_index for p in refill.batch.prompts] == [1, 2, 4, 6]
    assert [r.request_id for r in refill.batch.results] == ["1", "1", "2", "2", "4", "4", "6", "6"]
    verdict = dynamic_sampling_filter(refill.batch.shaped, group_ids_from_size(8, 2))
    assert verdict.dropped_groups == 0
    assert refill.batch.rewards.metrics["index"] == (1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0)
    assert refill.metrics == {
        "dynamic_sampling/rounds": 2.0,
        "dynamic_sampling/generated_groups": 8.0,
        "dynamic_sampling/dropped_groups": 3.0,  # prompts 0, 3 and 5
        "dynamic_sampling/padded_groups": 0.0,
    }
    assert len(refill.generated) == 16  # every response generated, for the training metrics
    # the sampler stands after both rounds: a resumed run takes prompt 8 next, as this one does
    assert sampler.state_dict()["consumed_samples"] == 8
    resumed = _sampler()
    resumed.load_state_dict(sampler.state_dict())
    assert resumed.next_batch().indices == sampler.next_batch().indices == (8, 9, 10, 11)


def test_when_rounds_run_out_the_batch_is_padded_with_dropped_groups() -> None:
    sampler, seen = _sampler(), list[int]()
    refill = refill_groups(
        lambda _: _roll_out(sampler, 2, seen), max_rounds=1, global_sum=lambda v: v
    )
    assert [p.source_index for p in refill.batch.prompts] == [1, 2, 0, 3]
    assert refill.metrics["dynamic_sampling/padded_groups"] == 2.0
    assert refill.metrics["dynamic_sampling/rounds"] == 1.0
    assert sampler.state_dict()["consumed_samples"] == 4


def test_a_rank_keeps_generating_while_another_rank_misses_groups() -> None:
    """The stop decision is on the global deficit: a full rank still makes the round (its
    generate and the sampler stay in step with the other ranks) and keeps its first groups."""
    sampler, seen = _sampler(), list[int]()
    calls: list[list[float]] = []

    def other_rank_misses_one(values: list[float]) -> list[float]:
        calls.append(values)
        return [values[0] + 1] if len(calls) == 1 else values

    def roll_out(round_index: int) -> ScoredGroups:
        part = _roll_out(sampler, 2, seen)
        # every group of this rank has a spread
        shaped = torch.tensor([float(j % 2) for j in range(len(part.results))])
        return attrs.evolve(part, shaped=shaped)

    refill = refill_groups(roll_out, max_rounds=3, global_sum=other_rank_misses_one)
    assert refill.metrics["dynamic_sampling/rounds"] == 2.0
    assert [p.source_index for p in refill.batch.prompts] == [0, 1, 2, 3]
    assert seen == list(range(8))
