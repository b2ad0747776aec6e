"""Rank-side checks of ``RolloutEngineSuite`` on what the other checks never send: sampling with
no seed, and later turns of a conversation under the same request id, as the multi-turn episode
driver sends them (the prompt, the engine's own output, then the environment's observation)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from lrft.api import GenerationRequest, SamplingParams
from lrft.testing.conformance._rollout_asserts import (
    assert_close_logprobs,
    generate_checked,
)
from lrft.testing.conformance._rollout_common import (
    EngineModels,
    rank_prompts,
    ready_engine,
    reference_greedy,
    reference_model,
    requests_for,
    require_capability,
    rollout_check,
)
from lrft.testing.conformance._rollout_logprob_path_checks import assert_unmasked_logprobs
from lrft.testing.conformance._rollout_sampling_checks import (
    HALF_THE_VOCABULARY,
    assert_ends_at_first_stop,
)
from lrft.testing.reference import token_logprobs

if TYPE_CHECKING:
    from lrft.testing.conformance._rollout_common import Suite

#: the observations the environment answers each turn with (token ids of a tool's result)
OBSERVATIONS = ((40, 41), (90, 91, 92))
#: tokens per turn, and the conversation's budget (the episode driver caps each turn at what
#: is left of it)
TURN_TOKENS = 5
BUDGET = 13


@rollout_check
def check_unseeded_sampling(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """Sampling with no seed: two calls draw other samples (an engine that seeds every unseeded
    call alike hands a trainer the same rollouts at every step), and the samples still end as
    the stop ids say and carry the reference's logprobs. The latter is what a TP group whose
    ranks drew different tokens for a row breaks: each rank goes on from another token, and
    the group's logits are of no sequence."""
    engine = ready_engine(suite, models, device)
    requests = requests_for(rank_prompts(rank)[:3])
    plain = SamplingParams(n=2, temperature=1.0, max_new_tokens=8)
    first = [r.output_token_ids for r in generate_checked(engine, requests, plain)]
    second = [r.output_token_ids for r in generate_checked(engine, requests, plain)]
    assert first != second, (
        f"two unseeded calls of the same {len(requests)} requests (n=2, temperature 1) drew the "
        f"same samples {first}: without a seed each call must draw afresh"
    )
    require_capability(engine, "returns_logprobs")
    reference = reference_model(models.base_dir, device)
    stopping = SamplingParams(
        n=2, temperature=0.7, max_new_tokens=8, min_new_tokens=2,
        stop_token_ids=HALF_THE_VOCABULARY, return_logprobs=True,
    )  # fmt: skip
    for result in generate_checked(engine, requests, stopping):
        assert_ends_at_first_stop(result, stopping, "sampled with no seed")
        assert_unmasked_logprobs(reference, result, stopping, "sampled with no seed")


def _turn_requests(
    contexts: Sequence[tuple[int, ...]], spent: Sequence[int], turn: int
) -> list[GenerationRequest]:
    """The conversations' next turns (each capped at what is left of its budget), and a request
    of another conversation that starts at this turn."""
    turns = [
        GenerationRequest(
            prompt_token_ids=context,
            request_id=f"conversation{index}",
            max_new_tokens=min(TURN_TOKENS, BUDGET - used),
        )
        for index, (context, used) in enumerate(zip(contexts, spent, strict=True))
    ]
    fresh = GenerationRequest(prompt_token_ids=contexts[0][:3], request_id=f"started-at-{turn}")
    return [*turns, fresh]


@rollout_check
def check_multi_turn_continuation(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """Three turns of three conversations, each turn under its conversation's request id with
    the whole context so far (its prompt, the engine's outputs and the observations after
    them) and the budget left as its cap, in a batch with a request that starts afresh: every
    turn equals the reference decode of its whole context, logprobs too. State an engine keeps
    per request id (a prefix or KV cache, a result) must serve the context it is given."""
    engine = ready_engine(suite, models, device)
    logprobs = "returns_logprobs" in engine.capabilities.names()
    reference = reference_model(models.base_dir, device) if logprobs else None
    contexts = list(rank_prompts(rank)[:3])
    spent = [0] * len(contexts)
    previous: list[tuple[int, ...]] = [() for _ in contexts]
    params = SamplingParams(temperature=0.0, max_new_tokens=TURN_TOKENS, return_logprobs=logprobs)
    for turn in range(len(OBSERVATIONS) + 1):
        requests = _turn_requests(contexts, spent, turn)
        results = generate_checked(engine, requests, params)
        for index, (request, result) in enumerate(zip(requests, results, strict=True)):
            limit = request.capped(params).max_new_tokens
            want = reference_greedy(models.base_dir, device, request.prompt_token_ids, limit)
            got = (result.output_token_ids, result.finish_reason)
            hint = ""
            if index < len(contexts) and got[0] == previous[index]:
                hint = "; it is this conversation's previous output again"
            assert got == want, (
                f"turn {turn} of request {request.request_id!r} (a context of "
                f"{len(request.prompt_token_ids)} tokens: its prompt, then the engine's outputs "
                f"and the observations of {turn} turns; cap {request.max_new_tokens}): the "
                f"engine gave {got}, the reference decode of the whole context gives {want}{hint}"
            )
            if reference is not None:
                expected = token_logprobs(reference, request.prompt_token_ids, got[0])
                assert_close_logprobs(
                    result.logprobs, expected, f"turn {turn} of request {request.request_id!r}"
                )
        if turn == len(OBSERVATIONS):
            break
        for index, result in enumerate(results[: len(contexts)]):
            observation = tuple((token + 7 * index) % 250 + 3 for token in OBSERVATIONS[turn])
            output = result.output_token_ids
            contexts[index] = (*contexts[index], *output, *observation)
            spent[index] += len(output)
            previous[index] = output
