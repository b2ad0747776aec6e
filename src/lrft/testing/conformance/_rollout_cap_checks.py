"""Rank-side check of ``RolloutEngineSuite`` for per-request token caps
(``GenerationRequest.max_new_tokens``), against the hand-written reference decode."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from lrft.api import GenerationRequest, SamplingParams
from lrft.testing.conformance._rollout_asserts import (
    generate_checked,
)
from lrft.testing.conformance._rollout_common import (
    NEW_TOKENS,
    EngineModels,
    group_leader,
    rank_prompts,
    ready_engine,
    reference_greedy,
    rollout_check,
)

if TYPE_CHECKING:
    from lrft.testing.conformance._rollout_common import Suite

#: caps of the prompts of a rank, in order: none, below the call's limit, 1, above the limit
_CAPS = (None, 5, 1, NEW_TOKENS + 4)


@rollout_check
def check_request_caps(suite: Suite, models: EngineModels, rank: int, device: torch.device) -> None:
    """A request's ``max_new_tokens`` caps each of its samples (``length`` at the cap), a cap
    above the call's limit changes nothing, a stop id before the cap still stops, and
    ``min_new_tokens`` applies up to the cap."""
    engine = ready_engine(suite, models, device)
    # the second prompt (whose greedy tokens give the stop id) is the TP group leader's on
    # every rank of the group: the group passes equal parameters
    own = rank_prompts(rank)
    prompts = (own[0], rank_prompts(group_leader(suite, rank))[1], *own[2 : len(_CAPS)])
    requests = [
        GenerationRequest(prompt_token_ids=prompt, request_id=f"r{i}", max_new_tokens=cap)
        for i, (prompt, cap) in enumerate(zip(prompts, _CAPS, strict=True))
    ]
    limits = [NEW_TOKENS if cap is None else min(cap, NEW_TOKENS) for cap in _CAPS]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS)
    results = generate_checked(engine, requests, greedy)
    for result, prompt, cap, limit in zip(results, prompts, _CAPS, limits, strict=True):
        want = reference_greedy(models.base_dir, device, prompt, limit)
        assert (result.output_token_ids, result.finish_reason) == want, (
            f"max_new_tokens={cap} under SamplingParams.max_new_tokens={NEW_TOKENS}, prompt "
            f"{prompt}: got {(result.output_token_ids, result.finish_reason)}, expected {want}"
        )
    # the capped request's third greedy token as a stop id: it stops there, before its cap
    stop = reference_greedy(models.base_dir, device, prompts[1], limits[1])[0][2]
    for minimum in (0, 7):
        params = SamplingParams(
            temperature=0.0, max_new_tokens=NEW_TOKENS, stop_token_ids=(stop,),
            min_new_tokens=minimum,
        )  # fmt: skip
        results = generate_checked(engine, requests, params)
        if minimum == 0:
            assert results[1].finish_reason == "stop", (
                f"stop id {stop} is among the first tokens of prompt {prompts[1]}, before its "
                f"cap {_CAPS[1]}: {results[1]}"
            )
        for result, prompt, cap, limit in zip(results, prompts, _CAPS, limits, strict=True):
            want = reference_greedy(
                models.base_dir, device, prompt, limit, (stop,), min(minimum, limit)
            )
            got = (result.output_token_ids, result.finish_reason)
            assert got == want, (
                f"max_new_tokens={cap}, stop id {stop}, min_new_tokens={minimum}, prompt "
                f"{prompt}: got {got}, expected {want} (min_new_tokens applies up to the cap)"
            )
    sampled = SamplingParams(n=2, temperature=1.0, max_new_tokens=NEW_TOKENS, seed=3)
    results = generate_checked(engine, requests, sampled)
    lengths = [len(result.output_token_ids) for result in results]
    assert lengths == [limit for limit in limits for _ in range(sampled.n)], (
        f"sampled lengths {lengths} for caps {_CAPS} (n=2): each sample gets its request's cap"
    )
