"""Rank-side checks of ``RolloutEngineSuite`` on the path reinforcement learning takes: logprobs
asked for together with stop ids, ``min_new_tokens`` and per-request caps (a trainer always asks
for logprobs, and the other checks of stops and caps do not), and an engine that adds no stop
ids of its own (the model's EOS ids are not stop ids unless ``SamplingParams`` names them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import torch

from lrft.api import GenerationRequest, GenerationResult, SamplingParams
from lrft.testing.conformance._rollout_asserts import (
    assert_close_logprobs,
    generate_checked,
)
from lrft.testing.conformance._rollout_common import (
    EOS_IDS,
    LOGPROB_TOLERANCE,
    NEW_TOKENS,
    EngineModels,
    rank_prompts,
    ready_engine,
    reference_greedy,
    reference_model,
    require_capability,
    rollout_check,
)
from lrft.testing.conformance._rollout_sampling_checks import (
    HALF_THE_VOCABULARY,
    assert_ends_at_first_stop,
)
from lrft.testing.reference import token_distributions

if TYPE_CHECKING:
    from lrft.testing.conformance._rollout_common import Suite

#: the requests' own caps: none, below, at and above ``_MINIMUM``
_CAPS = (None, 2, 4, 7, None)
_MINIMUM = 4


def _capped_requests(rank: int) -> list[GenerationRequest]:
    return [
        GenerationRequest(prompt_token_ids=prompt, request_id=f"r{i}", max_new_tokens=cap)
        for i, (prompt, cap) in enumerate(zip(rank_prompts(rank), _CAPS, strict=True))
    ]


def assert_unmasked_logprobs(
    reference: torch.nn.Module, result: GenerationResult, params: SamplingParams, setting: str
) -> None:
    """``result``'s logprobs are ``log_softmax(logits / T)`` of the reference, unmasked: before
    ``min_new_tokens`` too, where the engine masks the stop ids while it samples. A value that
    equals the distribution renormalised over the ids left after masking is named so."""
    where = f"{setting}: request {result.request_id!r} sample {result.sample_index}"
    temperature = 1.0 if params.greedy else params.temperature
    tokens = result.output_token_ids
    if not tokens:
        assert_close_logprobs(result.logprobs, [], where)
        return
    rows = token_distributions(reference, result.prompt_token_ids, tokens, temperature)
    chosen = torch.tensor(tokens, device=rows.device)[:, None]
    want = rows.gather(1, chosen)[:, 0].tolist()
    got = result.logprobs
    assert got is not None, f"{where}: return_logprobs=True but the result has no logprobs"
    assert len(got) == len(tokens), f"{where}: {len(got)} logprobs for {len(tokens)} tokens"
    stops = list(params.stop_token_ids)
    for position, (value, expected) in enumerate(zip(got, want, strict=True)):
        if abs(value - expected) <= LOGPROB_TOLERANCE:
            continue
        hint = ""
        if position < params.min_new_tokens and stops:
            masked = rows[position].clone()
            masked[stops] = float("-inf")
            renormalised = float(masked.log_softmax(-1)[tokens[position]])
            if abs(value - renormalised) <= 1e-4:
                hint = (
                    f"; {value:.6f} is the log-probability renormalised over the ids left after "
                    f"masking the {len(stops)} stop ids (position {position} is within "
                    f"min_new_tokens={params.min_new_tokens}): logprobs must be of the unmasked "
                    "distribution"
                )
        raise AssertionError(
            f"{where}: token {position} (id {tokens[position]}) of {tokens} has logprob "
            f"{value:.6f}, the reference log_softmax(logits / {temperature:g}) of the unmasked "
            f"distribution gives {expected:.6f} (tolerance {LOGPROB_TOLERANCE}){hint}"
        )


@rollout_check
def check_logprobs_with_stops_and_caps(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """With logprobs asked for, as RL asks: stop ids (half the vocabulary), ``min_new_tokens``
    and per-request caps below, at and above it, greedy and sampled. Each output ends at its
    first stop id or at its request's cap, no stop id comes within ``min_new_tokens`` (up to
    the cap), greedy outputs equal the reference decode, and every logprob is the reference's
    of the unmasked distribution, within ``min_new_tokens`` too."""
    engine = ready_engine(suite, models, device)
    require_capability(engine, "returns_logprobs")
    requests = _capped_requests(rank)
    reference = reference_model(models.base_dir, device)
    sampled = SamplingParams(
        n=2, temperature=0.8, max_new_tokens=10, min_new_tokens=_MINIMUM,
        stop_token_ids=HALF_THE_VOCABULARY, seed=13, return_logprobs=True,
    )  # fmt: skip
    greedy = attrs.evolve(sampled, n=1, temperature=0.0, seed=None)
    for params in (greedy, sampled):
        setting = f"{'greedy' if params.greedy else 'sampled'} with return_logprobs"
        for index, result in enumerate(generate_checked(engine, requests, params)):
            request = requests[index // params.n]
            capped = request.capped(params)
            described = f"{setting}, the request's cap {request.max_new_tokens}"
            assert_ends_at_first_stop(result, capped, described)
            if params.greedy:
                want = reference_greedy(
                    models.base_dir, device, request.prompt_token_ids, capped.max_new_tokens,
                    capped.stop_token_ids, capped.min_new_tokens,
                )  # fmt: skip
                got = (result.output_token_ids, result.finish_reason)
                assert got == want, (
                    f"{described}: request {request.request_id!r} (prompt "
                    f"{request.prompt_token_ids}) gave {got}, the reference decode (stop ids "
                    f"masked for {capped.min_new_tokens} steps) gives {want}"
                )
            assert_unmasked_logprobs(reference, result, capped, described)


@rollout_check
def check_no_stop_tokens_of_its_own(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """An engine serving a model whose config and generation config declare half the vocabulary
    its EOS ids (``EngineModels.eos_dir``) runs every output with no stop ids to
    ``max_new_tokens`` (reason ``length``), greedy, sampled and with logprobs: only
    ``SamplingParams.stop_token_ids`` stop, as the contract says (pass the tokenizer's EOS
    there)."""
    engine = ready_engine(suite, models, device, models.eos_dir)
    prompts = rank_prompts(rank)
    greedy = [reference_greedy(models.base_dir, device, p)[0] for p in prompts]
    met = [t for tokens in greedy for t in tokens if t in EOS_IDS]
    assert met, (
        f"the reference greedy continuations of {prompts} meet none of the EOS ids the folder "
        "declares: the check would prove nothing (a fault of the suite, not of the engine)"
    )
    logprobs = "returns_logprobs" in engine.capabilities.names()
    requests = [
        GenerationRequest(prompt_token_ids=p, request_id=f"r{i}") for i, p in enumerate(prompts)
    ]
    for params in (
        SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS, return_logprobs=logprobs),
        SamplingParams(n=2, temperature=1.0, max_new_tokens=NEW_TOKENS, seed=5),
    ):
        for index, result in enumerate(generate_checked(engine, requests, params)):
            tokens = result.output_token_ids
            eos = [(j, t) for j, t in enumerate(tokens) if t in EOS_IDS]
            where = (
                f"{'greedy' if params.greedy else 'sampled'}, no stop ids, a model declaring "
                f"{len(EOS_IDS)} EOS ids: request {result.request_id!r} sample "
                f"{result.sample_index} (prompt {result.prompt_token_ids}) gave {tokens} "
                f"({result.finish_reason!r})"
            )
            ended = f"; it ended at the model's EOS id {eos[-1][1]}" if eos else ""
            assert (len(tokens), result.finish_reason) == (NEW_TOKENS, "length"), (
                f"{where}: with no stop ids every output runs to max_new_tokens={NEW_TOKENS} "
                f"with reason 'length'{ended}: an engine adds no stop ids of its own"
            )
            if params.greedy:
                want = greedy[index]
                assert tokens == want, f"{where}: the reference greedy decode gives {want}"
