"""Rank-side generation checks of ``RolloutEngineSuite``: each compares an engine with the
hand-written reference decode of ``_rollout_common`` or with an exact property of sampling."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import pytest
import torch

from lrft.api import (
    CapabilityNotSupported,
    EngineCapabilities,
    GenerationRequest,
    RolloutEngine,
    SamplingParams,
)
from lrft.testing.conformance._rollout_common import (
    BASE_VERSION,
    NEW_TOKENS,
    EngineModels,
    assert_close_logprobs,
    assert_matches_reference,
    assert_request_major,
    backdoor_digests,
    greedy_outputs,
    rank_check,
    rank_prompts,
    ready_engine,
    reference_greedy,
    reference_model,
    requests_for,
    require_capability,
)
from lrft.testing.reference import token_logprobs

if TYPE_CHECKING:
    from lrft.testing.conformance._rollout_common import Suite


_PROTOCOL_MEMBERS = sorted(
    {name for name in vars(RolloutEngine) if not name.startswith("_")} | {"__enter__", "__exit__"}
)


@rank_check
def check_protocol_surface(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = ready_engine(suite, models, device)
    missing = [member for member in _PROTOCOL_MEMBERS if not hasattr(engine, member)]
    assert isinstance(engine, RolloutEngine), (
        f"{type(engine).__name__} is not a RolloutEngine: it lacks {sorted(missing)}"
    )
    assert isinstance(engine.capabilities, EngineCapabilities), engine.capabilities
    assert isinstance(engine.name, str), f"engine name {engine.name!r}"
    assert engine.name, "the engine's name is empty"
    backdoor = suite.read_engine_weights(engine)
    specs = engine.parameter_specs()
    assert set(specs) == set(backdoor), (
        f"parameter_specs() names differ from the weights the engine holds: only in specs "
        f"{sorted(set(specs) - set(backdoor))}, only held {sorted(set(backdoor) - set(specs))}"
    )
    for name, tensor in backdoor.items():
        spec = specs[name]
        assert (spec.shape, spec.dtype) == (tuple(tensor.shape), tensor.dtype), (
            f"parameter_specs()[{name!r}] says {spec}, the engine holds {tuple(tensor.shape)} "
            f"{tensor.dtype}"
        )
    assert engine.weights_version == BASE_VERSION == engine.state.weights_version, (
        f"after load_weights(version={BASE_VERSION}): weights_version {engine.weights_version}, "
        f"state {engine.state}"
    )


@rank_check
def check_greedy_matches_reference(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = ready_engine(suite, models, device)
    prompts = rank_prompts(rank)
    got = greedy_outputs(engine, prompts)
    assert_matches_reference(got, prompts, models.base_dir, device, "greedy batch")


@rank_check
def check_greedy_logprobs(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = ready_engine(suite, models, device)
    require_capability(engine, "returns_logprobs")
    prompts = rank_prompts(rank)
    params = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS, return_logprobs=True)
    reference = reference_model(models.base_dir, device)
    for result in engine.generate(requests_for(prompts), params):
        want = token_logprobs(reference, result.prompt_token_ids, result.output_token_ids)
        assert_close_logprobs(result.logprobs, want, f"greedy, prompt {result.prompt_token_ids}")


@rank_check
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
    for result in engine.generate(requests_for(rank_prompts(rank)[:3]), params):
        want = token_logprobs(
            reference, result.prompt_token_ids, result.output_token_ids, temperature
        )
        where = f"sampled T={temperature}, prompt {result.prompt_token_ids}"
        assert_close_logprobs(result.logprobs, want, where)


@rank_check
def check_max_new_tokens(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = ready_engine(suite, models, device)
    prompts = rank_prompts(rank)
    for limit in (1, 5):
        for prompt, (tokens, reason) in zip(
            prompts, greedy_outputs(engine, prompts, max_new_tokens=limit), strict=True
        ):
            want = reference_greedy(models.base_dir, device, prompt)[0][:limit]
            assert (tokens, reason) == (want, "length"), (
                f"max_new_tokens={limit}, prompt {prompt}: got {tokens} ({reason}), expected "
                f"{want} ('length')"
            )
    sampled = SamplingParams(temperature=1.0, max_new_tokens=7, n=2, seed=3)
    for result in engine.generate(requests_for(prompts), sampled):
        assert len(result.output_token_ids) == 7, result
        assert result.finish_reason == "length", result
        assert result.logprobs is None, "logprobs returned although return_logprobs=False"


def _stop_position(continuation: tuple[int, ...]) -> int:
    """The last position whose token does not occur earlier, so that stopping at it ends the
    output exactly there (position 0 always qualifies)."""
    return max(j for j in range(len(continuation)) if continuation[j] not in continuation[:j])


@rank_check
def check_stop_token_ids(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = ready_engine(suite, models, device)
    prompts = rank_prompts(rank)
    continuation, _ = reference_greedy(models.base_dir, device, prompts[0])
    position = _stop_position(continuation)
    assert position >= 2, f"the reference continuation {continuation} repeats too early"
    stop = continuation[position]
    got = greedy_outputs(engine, prompts, stop_token_ids=(stop,))
    assert got[0] == (continuation[: position + 1], "stop"), (
        f"stop id {stop} first occurs at position {position} of the reference continuation "
        f"{continuation} of prompt {prompts[0]}; the engine gave {got[0]}"
    )
    for prompt, completion in zip(prompts, got, strict=True):
        want = reference_greedy(models.base_dir, device, prompt, NEW_TOKENS, (stop,))
        assert completion == want, (
            f"stop_token_ids=({stop},), prompt {prompt}: engine gave {completion}, the "
            f"reference gives {want}"
        )


@rank_check
def check_min_new_tokens(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = ready_engine(suite, models, device)
    prompt = rank_prompts(rank)[1]
    stop = reference_greedy(models.base_dir, device, prompt)[0][0]
    [immediate] = greedy_outputs(engine, [prompt], stop_token_ids=(stop,))
    assert immediate == ((stop,), "stop"), (
        f"the first greedy token {stop} is a stop id, so the output must be just it: {immediate}"
    )
    minimum = 4
    [(tokens, reason)] = greedy_outputs(
        engine, [prompt], stop_token_ids=(stop,), min_new_tokens=minimum
    )
    assert stop not in tokens[:minimum], (
        f"stop id {stop} emitted within min_new_tokens={minimum}: {tokens}"
    )
    want = reference_greedy(models.base_dir, device, prompt, NEW_TOKENS, (stop,), minimum)
    assert (tokens, reason) == want, (
        f"min_new_tokens={minimum}, stop id {stop}: engine gave {(tokens, reason)}, the "
        f"reference (stop id masked for {minimum} steps) gives {want}"
    )


@rank_check
def check_n_samples(suite: Suite, models: EngineModels, rank: int, device: torch.device) -> None:
    engine = ready_engine(suite, models, device)
    requests = requests_for(rank_prompts(rank)[:3])
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=8, seed=5)
    results = engine.generate(requests, params)
    assert_request_major(results, requests, params.n)
    for index, request in enumerate(requests):
        samples = {r.output_token_ids for r in results[index * 3 : index * 3 + 3]}
        assert len(samples) > 1, (
            f"the 3 samples of request {request.request_id!r} are identical ({samples}): n must "
            "draw independent samples, not copies"
        )


@rank_check
def check_truncated_sampling_is_greedy(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """top_k=1 and a tiny top_p leave only the most likely token, so sampling becomes greedy;
    plain sampling with the same seed must not be greedy, or the check would prove nothing."""
    engine = ready_engine(suite, models, device)
    prompts = rank_prompts(rank)
    greedy = [reference_greedy(models.base_dir, device, prompt)[0] for prompt in prompts]
    plain = SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS, seed=3)
    results = engine.generate(requests_for(prompts), plain)
    assert [r.output_token_ids for r in results] != greedy, "plain sampling gave greedy tokens"
    for truncation in (attrs.evolve(plain, top_k=1), attrs.evolve(plain, top_p=1e-6)):
        results = engine.generate(requests_for(prompts), truncation)
        for result, want in zip(results, greedy, strict=True):
            assert result.output_token_ids == want, (
                f"sampling with top_k={truncation.top_k}, top_p={truncation.top_p} must equal "
                f"greedy; prompt "
                f"{result.prompt_token_ids}: got {result.output_token_ids}, greedy {want}"
            )


def _rng_states(device: torch.device) -> list[torch.Tensor]:
    states = [torch.get_rng_state()]
    if device.type == "cuda":
        states.append(torch.cuda.get_rng_state(device))
    return states


@rank_check
def check_seed(suite: Suite, models: EngineModels, rank: int, device: torch.device) -> None:
    engine = ready_engine(suite, models, device)
    requests = requests_for(rank_prompts(rank)[:3])

    def sample(seed: int) -> list[tuple[int, ...]]:
        params = SamplingParams(n=2, temperature=1.0, max_new_tokens=8, seed=seed)
        return [r.output_token_ids for r in engine.generate(requests, params)]

    torch.manual_seed(1234)
    before = _rng_states(device)
    first = sample(7)
    after = _rng_states(device)
    assert all(map(torch.equal, before, after)), "a seeded generate changed the caller's RNG"
    torch.rand(100, device=device)  # moves the global stream; seeded sampling must not care
    assert sample(7) == first, "the same seed gave different samples"
    assert sample(8) != first, "different seeds gave the same samples"


@rank_check
def check_batch_independence(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = ready_engine(suite, models, device)
    prompts = rank_prompts(rank)
    alone = [greedy_outputs(engine, [prompt])[0] for prompt in prompts]
    assert_matches_reference(alone, prompts, models.base_dir, device, "one prompt per batch")
    batches = [prompts[::-1], (prompts[2], prompts[3], prompts[2], prompts[0]) * 2]
    for batch in batches:
        for prompt, completion in zip(batch, greedy_outputs(engine, batch), strict=True):
            expected = alone[prompts.index(prompt)]
            assert completion == expected, (
                f"prompt {prompt} gave {completion} in a batch of {len(batch)} but {expected} "
                "alone: a request's result must not depend on the rest of its batch"
            )
    duplicated = greedy_outputs(engine, prompts[:2], n=2)
    assert duplicated == [alone[0], alone[0], alone[1], alone[1]], duplicated


@rank_check
def check_uneven_requests(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """Every rank calls ``generate`` equally often (a collective over the TP group, and over
    every engine of an engine that steps its data-parallel copies together), but with its own
    number of requests, none included: each gets exactly its own results."""
    engine = ready_engine(suite, models, device)
    prompts = rank_prompts(rank)
    for count in (rank % 3, 0 if rank % 2 else len(prompts)):
        mine = prompts[:count]
        got = greedy_outputs(engine, mine)
        assert len(got) == count, f"rank {rank} sent {count} requests and got {len(got)} results"
        assert_matches_reference(
            got, mine, models.base_dir, device, f"rank {rank}, {count} requests"
        )


@rank_check
def check_multimodal_gated(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = ready_engine(suite, models, device)
    if "multimodal" in engine.capabilities.names():
        pytest.skip(f"{engine.name} engine declares capability multimodal: nothing to refuse")
    before = backdoor_digests(suite, engine)
    request = GenerationRequest(
        prompt_token_ids=rank_prompts(rank)[0], multimodal={"image": torch.zeros(3, 4, 4)}
    )
    with pytest.raises(CapabilityNotSupported) as raised:
        engine.generate([request], SamplingParams(temperature=0.0, max_new_tokens=2))
    assert (raised.value.backend, raised.value.capability) == (engine.name, "multimodal"), (
        f"CapabilityNotSupported must name backend {engine.name!r} and capability "
        f"'multimodal': {raised.value}"
    )
    assert backdoor_digests(suite, engine) == before
