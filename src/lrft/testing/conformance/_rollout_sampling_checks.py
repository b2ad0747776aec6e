"""Rank-side checks of ``RolloutEngineSuite`` on the sampled path: logprobs, ``n``, seeds, stop
ids and ``min_new_tokens`` while sampling, and that samples come from the distribution asked
for: inside the top-k set and the nucleus, and at the temperature given (a statistical test on
the reference's log-probabilities of what was drawn, not only the logprobs the engine reports).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import attrs
import torch

from lrft.api import GenerationResult, SamplingParams
from lrft.testing.conformance._rollout_asserts import (
    assert_close_logprobs,
    generate_checked,
)
from lrft.testing.conformance._rollout_common import (
    NEW_TOKENS,
    EngineModels,
    rank_prompts,
    ready_engine,
    reference_greedy,
    reference_model,
    requests_for,
    require_capability,
    rollout_check,
)
from lrft.testing.models import VOCAB_SIZE
from lrft.testing.reference import token_distributions, token_logprobs

if TYPE_CHECKING:
    from lrft.testing.conformance._rollout_common import Suite

#: odd token ids: about half of the probability mass of the test models, so that sampling meets
#: one within a few tokens
HALF_THE_VOCABULARY = tuple(range(3, VOCAB_SIZE, 2))
#: |z| above this fails the temperature test: a correct engine exceeds it with probability
#: about 6e-7; sampling at T=1 when asked for T=0.7 gives |z| near 11 (measured on the hf engine)
Z_LIMIT = 5.0
#: how much more probability than ``top_p`` the tokens ranked above a sampled one may hold:
#: float32 softmax rounding, not a real excess
NUCLEUS_SLACK = 1e-4


@rollout_check
def check_sampled_logprobs(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """Logprobs are under ``logits / T`` and before top-k/top-p truncation (which would
    renormalise them), so truncation is switched on here to catch engines that report after it."""
    engine = ready_engine(suite, models, device)
    require_capability(engine, "returns_logprobs")
    temperature = 0.7
    params = SamplingParams(
        n=2, temperature=temperature, top_k=20, top_p=0.9, max_new_tokens=8, seed=11,
        return_logprobs=True,
    )  # fmt: skip
    reference = reference_model(models.base_dir, device)
    for result in generate_checked(engine, requests_for(rank_prompts(rank)[:3]), params):
        want = token_logprobs(
            reference, result.prompt_token_ids, result.output_token_ids, temperature
        )
        where = f"sampled T={temperature}, prompt {result.prompt_token_ids}"
        assert_close_logprobs(result.logprobs, want, where)


@rollout_check
def check_n_samples(suite: Suite, models: EngineModels, rank: int, device: torch.device) -> None:
    engine = ready_engine(suite, models, device)
    requests = requests_for(rank_prompts(rank)[:3])
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=8, seed=5)
    results = generate_checked(engine, requests, params)
    for index, request in enumerate(requests):
        samples = {r.output_token_ids for r in results[index * 3 : index * 3 + 3]}
        assert len(samples) > 1, (
            f"the 3 samples of request {request.request_id!r} are identical ({samples}): n must "
            "draw independent samples, not copies"
        )


@rollout_check
def check_truncated_sampling_is_greedy(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """top_k=1 and a tiny top_p each leave only the most likely token, so sampling becomes
    greedy, also when the other is set too (an engine must apply both); plain sampling with the
    same seed must not be greedy, or the check would prove nothing."""
    engine = ready_engine(suite, models, device)
    prompts = rank_prompts(rank)
    greedy = [reference_greedy(models.base_dir, device, prompt)[0] for prompt in prompts]
    plain = SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS, seed=3)
    results = generate_checked(engine, requests_for(prompts), plain)
    sampled = [r.output_token_ids for r in results]
    assert sampled != greedy, f"plain sampling gave the greedy tokens {greedy}"
    for top_k, top_p in ((1, 1.0), (0, 1e-6), (50, 1e-6), (1, 0.9)):
        truncation = attrs.evolve(plain, top_k=top_k, top_p=top_p)
        results = generate_checked(engine, requests_for(prompts), truncation)
        for result, want in zip(results, greedy, strict=True):
            assert result.output_token_ids == want, (
                f"sampling with top_k={top_k}, top_p={top_p} keeps only the most likely token, "
                f"so it must equal greedy; prompt {result.prompt_token_ids}: got "
                f"{result.output_token_ids}, greedy {want}"
            )


def _rng_states(device: torch.device) -> list[torch.Tensor]:
    states = [torch.get_rng_state()]
    if device.type == "cuda":
        states.append(torch.cuda.get_rng_state(device))
    return states


@rollout_check
def check_seed(suite: Suite, models: EngineModels, rank: int, device: torch.device) -> None:
    engine = ready_engine(suite, models, device)
    requests = requests_for(rank_prompts(rank)[:3])

    def sample(seed: int) -> list[tuple[int, ...]]:
        params = SamplingParams(n=2, temperature=1.0, max_new_tokens=8, seed=seed)
        return [r.output_token_ids for r in generate_checked(engine, requests, params)]

    torch.manual_seed(1234)
    before = _rng_states(device)
    first = sample(7)
    after = _rng_states(device)
    assert all(map(torch.equal, before, after)), "a seeded generate changed the caller's RNG"
    torch.rand(100, device=device)  # moves the global stream; seeded sampling must not care
    again = sample(7)
    assert again == first, f"the same seed gave different samples: {first}, then {again}"
    other = sample(8)
    assert other != first, f"seeds 7 and 8 gave the same samples {first}"


def assert_ends_at_first_stop(
    result: GenerationResult, params: SamplingParams, setting: str = "sampled"
) -> None:
    """No stop id before ``min_new_tokens``; the output ends at its first stop id (reason
    ``stop``) or, with none, at ``max_new_tokens`` (reason ``length``). ``params`` are those
    that apply to the result's request (``GenerationRequest.capped``)."""
    tokens, stops = result.output_token_ids, set(params.stop_token_ids)
    where = (
        f"{setting} with {len(stops)} stop ids, min_new_tokens={params.min_new_tokens}, "
        f"max_new_tokens={params.max_new_tokens}: request {result.request_id!r} sample "
        f"{result.sample_index} (prompt {result.prompt_token_ids}) gave {tokens} "
        f"({result.finish_reason!r})"
    )
    early = [j for j, token in enumerate(tokens[: params.min_new_tokens]) if token in stops]
    assert not early, (
        f"{where}: stop id {tokens[early[0]]} at position {early[0]} is within min_new_tokens"
    )
    assert len(tokens) <= params.max_new_tokens, (
        f"{where}: {len(tokens)} tokens, above the {params.max_new_tokens} allowed"
    )
    first = next((j for j, token in enumerate(tokens) if token in stops), None)
    if first is None:
        assert (len(tokens), result.finish_reason) == (params.max_new_tokens, "length"), (
            f"{where}: with no stop id the output must run to max_new_tokens, reason 'length'"
        )
    else:
        assert (first, result.finish_reason) == (len(tokens) - 1, "stop"), (
            f"{where}: the output must end at its first stop id ({tokens[first]} at position "
            f"{first}), with reason 'stop'"
            + (
                f"; the engine went on for {len(tokens) - 1 - first} more tokens"
                if first < len(tokens) - 1
                else ""
            )
        )


@rollout_check
def check_sampled_stops_and_min_new_tokens(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """The greedy checks of stop ids and ``min_new_tokens``, on the sampled path: with half the
    vocabulary as stop ids, samples meet one within a few tokens."""
    engine = ready_engine(suite, models, device)
    requests = requests_for(rank_prompts(rank))
    minimum = 4
    params = SamplingParams(
        n=4, temperature=1.0, max_new_tokens=10, stop_token_ids=HALF_THE_VOCABULARY, seed=21
    )
    free = generate_checked(engine, requests, params)
    for result in free:
        assert_ends_at_first_stop(result, params)
    early = [r for r in free if r.finish_reason == "stop" and len(r.output_token_ids) <= minimum]
    assert early, (
        f"no sampled output met a stop id within {minimum} tokens: the min_new_tokens part "
        f"would prove nothing ({[r.output_token_ids for r in free]})"
    )
    held = attrs.evolve(params, min_new_tokens=minimum)
    for result in generate_checked(engine, requests, held):
        assert_ends_at_first_stop(result, held)


@rollout_check
def check_samples_follow_the_distribution(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """Every sampled token lies in the reference's top-k set and nucleus; untruncated samples
    come from ``softmax(logits / T)``: the reference log-probability of each drawn token, summed,
    is within ``Z_LIMIT`` standard errors of its expectation under that distribution."""
    engine = ready_engine(suite, models, device)
    reference = reference_model(models.base_dir, device)
    requests = requests_for(rank_prompts(rank))
    truncated = SamplingParams(n=4, temperature=0.8, top_k=20, top_p=0.2, max_new_tokens=8, seed=31)
    for result in generate_checked(engine, requests, truncated):
        _assert_inside_truncation(reference, result, truncated)
    plain = SamplingParams(n=16, temperature=0.7, max_new_tokens=8, seed=41)
    excess, variance, count = 0.0, 0.0, 0
    for result in generate_checked(engine, requests, plain):
        logprobs = token_distributions(
            reference, result.prompt_token_ids, result.output_token_ids, plain.temperature
        )
        drawn = logprobs.gather(
            1, torch.tensor(result.output_token_ids, device=logprobs.device)[:, None]
        )[:, 0]
        expected = (logprobs.exp() * logprobs).sum(dim=1)
        excess += float((drawn - expected).sum())
        variance += float(
            (logprobs.exp() * logprobs.square()).sum(dim=1).sub(expected.square()).sum()
        )
        count += len(result.output_token_ids)
    z = excess / math.sqrt(variance)
    assert abs(z) <= Z_LIMIT, (
        f"{count} tokens sampled at temperature {plain.temperature}: their mean reference "
        f"log-probability under log_softmax(logits / {plain.temperature}) is {z:+.1f} standard "
        f"errors from its expectation (limit {Z_LIMIT:g}); {'above' if z > 0 else 'below'}: "
        f"the engine samples from a {'sharper' if z > 0 else 'flatter'} distribution, as at a "
        f"{'lower' if z > 0 else 'higher'} temperature"
    )


def _assert_inside_truncation(
    reference: torch.nn.Module, result: GenerationResult, params: SamplingParams
) -> None:
    logprobs = token_distributions(
        reference, result.prompt_token_ids, result.output_token_ids, params.temperature
    )
    for position, token in enumerate(result.output_token_ids):
        row = logprobs[position]
        above = row > row[token]
        rank, mass = int(above.sum()), float(row[above].exp().sum())
        where = (
            f"sampled with temperature {params.temperature}, top_k={params.top_k}, "
            f"top_p={params.top_p}: token {token} at position {position} of "
            f"{result.output_token_ids} "
            f"(prompt {result.prompt_token_ids})"
        )
        assert rank < params.top_k, (
            f"{where} is only the {rank + 1}th most likely under the reference; top_k allows "
            f"the first {params.top_k}"
        )
        assert mass < params.top_p + NUCLEUS_SLACK, (
            f"{where}: the tokens more likely than it already hold probability {mass:.4f} under "
            f"the reference, so it is outside the top_p={params.top_p} nucleus"
        )
