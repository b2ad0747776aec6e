"""Rank-side generation checks of ``RolloutEngineSuite`` on the greedy path and the shape of
results: each compares an engine with the hand-written reference decode of ``_rollout_common``.
The sampled path's checks are in ``_rollout_sampling_checks``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import torch

from lrft.api import (
    MODALITIES,
    AudioClip,
    CapabilityNotSupported,
    EngineCapabilities,
    GenerationRequest,
    MediaInputs,
    RolloutEngine,
    SamplingParams,
)
from lrft.testing.conformance._rollout_asserts import (
    assert_close_logprobs,
    assert_matches_reference,
    generate_checked,
    greedy_outputs,
)
from lrft.testing.conformance._rollout_common import (
    BASE_VERSION,
    NEW_TOKENS,
    EngineModels,
    backdoor_digests,
    group_leader,
    rank_prompts,
    ready_engine,
    reference_greedy,
    reference_model,
    requests_for,
    require_capability,
    rollout_check,
)
from lrft.testing.conformance.expect import raises
from lrft.testing.models import VOCAB_SIZE
from lrft.testing.reference import token_logprobs

if TYPE_CHECKING:
    from lrft.testing.conformance._rollout_common import Suite


_PROTOCOL_MEMBERS = sorted(
    {name for name in vars(RolloutEngine) if not name.startswith("_")} | {"__enter__", "__exit__"}
)


@rollout_check
def check_protocol_surface(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = ready_engine(suite, models, device)
    missing = [member for member in _PROTOCOL_MEMBERS if not hasattr(engine, member)]
    assert isinstance(engine, RolloutEngine), (
        f"{type(engine).__name__} is not a RolloutEngine: it lacks {sorted(missing)}"
    )
    assert isinstance(engine.capabilities, EngineCapabilities), (
        f"capabilities is a {type(engine.capabilities).__name__}, not EngineCapabilities: "
        f"{engine.capabilities!r}"
    )
    assert isinstance(engine.name, str), f"engine name {engine.name!r} is not a string"
    assert engine.name, "the engine's name is empty"
    max_tp = engine.capabilities.max_tp
    assert suite.tp_size <= max_tp, (
        f"the suite runs the {engine.name} engine in TP groups of {suite.tp_size} "
        f"({suite.__name__}.tp_size), but it declares max_tp={max_tp}"
    )
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


@rollout_check
def check_greedy_matches_reference(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = ready_engine(suite, models, device)
    prompts = rank_prompts(rank)
    got = greedy_outputs(engine, prompts)
    assert_matches_reference(got, prompts, models.base_dir, device, "greedy batch")


@rollout_check
def check_greedy_logprobs(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = ready_engine(suite, models, device)
    require_capability(engine, "returns_logprobs")
    prompts = rank_prompts(rank)
    params = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS, return_logprobs=True)
    reference = reference_model(models.base_dir, device)
    for result in generate_checked(engine, requests_for(prompts), params):
        want = token_logprobs(reference, result.prompt_token_ids, result.output_token_ids)
        assert_close_logprobs(result.logprobs, want, f"greedy, prompt {result.prompt_token_ids}")


@rollout_check
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
    for result in generate_checked(engine, requests_for(prompts), sampled):
        got = (len(result.output_token_ids), result.finish_reason, result.logprobs)
        assert got == (7, "length", None), (
            f"sampled, max_new_tokens=7, no stop ids, return_logprobs=False, prompt "
            f"{result.prompt_token_ids}: got {len(result.output_token_ids)} tokens, finish reason "
            f"{result.finish_reason!r}, logprobs {result.logprobs}; expected 7, 'length', None"
        )


def _stop_position(continuation: tuple[int, ...]) -> int:
    """The last position whose token does not occur earlier, so that stopping at it ends the
    output exactly there (position 0 always qualifies)."""
    return max(j for j in range(len(continuation)) if continuation[j] not in continuation[:j])


@rollout_check
def check_stop_token_ids(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """One stop id, the same among several (listed after one that never comes), and as the last
    token ``max_new_tokens`` allows (where the output still ends with reason ``stop``)."""
    engine = ready_engine(suite, models, device)
    # the stop ids come from the first prompt of the TP group's leader, which every rank of
    # the group sends first: the group passes equal parameters
    prompts = (rank_prompts(group_leader(suite, rank))[0], *rank_prompts(rank)[1:])
    continuation, _ = reference_greedy(models.base_dir, device, prompts[0])
    position = _stop_position(continuation)
    assert position >= 2, f"the reference continuation {continuation} repeats too early"
    stop = continuation[position]
    never = min(set(range(3, VOCAB_SIZE)) - set(continuation))
    for stops, limit in (
        ((stop,), NEW_TOKENS),
        ((never, stop), NEW_TOKENS),
        ((stop,), position + 1),
    ):
        got = greedy_outputs(engine, prompts, stop_token_ids=stops, max_new_tokens=limit)
        setting = f"stop_token_ids={stops}, max_new_tokens={limit}"
        assert got[0] == (continuation[: position + 1], "stop"), (
            f"{setting}: stop id {stop} first occurs at position {position} of the reference "
            f"continuation {continuation} of prompt {prompts[0]}, so the output ends there with "
            f"reason 'stop'; the engine gave {got[0]}"
        )
        for prompt, completion in zip(prompts, got, strict=True):
            want = reference_greedy(models.base_dir, device, prompt, limit, stops)
            assert completion == want, (
                f"{setting}, prompt {prompt}: engine gave {completion}, the reference gives {want}"
            )


@rollout_check
def check_min_new_tokens(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = ready_engine(suite, models, device)
    # the TP group's leader's prompt on every rank of the group: its stop id is the group's
    prompt = rank_prompts(group_leader(suite, rank))[1]
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


@rollout_check
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
    want = [alone[0], alone[0], alone[1], alone[1]]
    assert duplicated == want, (
        f"greedy with n=2 must repeat each request's completion: got {duplicated}, want {want}"
    )


@rollout_check
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


@rollout_check
def check_media_gated(suite: Suite, models: EngineModels, rank: int, device: torch.device) -> None:
    """A request with a modality the engine does not declare (``images``, ``audio``) is refused
    with ``CapabilityNotSupported`` naming it, before any work, and changes nothing."""
    engine = ready_engine(suite, models, device)
    declared = engine.capabilities.names()
    media = {
        "images": MediaInputs(images=[torch.zeros(3, 28, 28, dtype=torch.uint8)]),
        "audio": MediaInputs(audio=[AudioClip(waveform=torch.zeros(1600), sampling_rate=16000)]),
    }
    lacking = [modality for modality in MODALITIES if modality not in declared]
    if not lacking:
        pytest.skip(f"{engine.name} engine declares every modality: nothing to refuse")
    before = backdoor_digests(suite, engine)
    plain = GenerationRequest(prompt_token_ids=rank_prompts(rank)[1], request_id="plain")
    for modality in lacking:
        request = GenerationRequest(
            prompt_token_ids=rank_prompts(rank)[0], request_id=modality, media=media[modality]
        )
        with raises(CapabilityNotSupported, f"generate() of a request with {modality}") as raised:
            engine.generate([plain, request], SamplingParams(temperature=0.0, max_new_tokens=2))
        assert (raised.value.backend, raised.value.capability) == (engine.name, modality), (
            f"CapabilityNotSupported must name backend {engine.name!r} and capability "
            f"{modality!r}: {raised.value}"
        )
    changed = sorted(n for n, d in backdoor_digests(suite, engine).items() if before.get(n) != d)
    assert not changed, f"a refused request with media changed the weights {changed}"
