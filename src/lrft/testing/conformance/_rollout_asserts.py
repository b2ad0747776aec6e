"""Assertions on an engine's results shared by the rollout suite's checks: request-major order,
agreement with the reference's greedy decoding and logprobs, equal digests; each failure names
the request, the token, what was expected and what the engine did."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from lrft.api import (
    FinishReason,
    GenerationRequest,
    GenerationResult,
    RolloutEngine,
    SamplingParams,
)
from lrft.testing.conformance._rollout_common import (
    LOGPROB_TOLERANCE,
    NEW_TOKENS,
    reference_greedy,
    requests_for,
)

# --- checks on results --------------------------------------------------------------------------


def assert_request_major(
    results: Sequence[GenerationResult], requests: Sequence[GenerationRequest], n: int
) -> None:
    """Results must be ``len(requests) * n`` long, sample ``j`` of request ``i`` at ``i * n + j``,
    each answering one of this call's own requests."""
    assert len(results) == len(requests) * n, (
        f"{len(results)} results for {len(requests)} requests x n={n}"
    )
    asked = {(request.request_id, request.prompt_token_ids) for request in requests}
    for index, result in enumerate(results):
        answered = (result.request_id, result.prompt_token_ids)
        assert answered in asked, (
            f"result {index} answers request {result.request_id!r} (prompt "
            f"{result.prompt_token_ids}), which is not among the {len(requests)} requests of this "
            "call: each rank must get back results of its own requests only"
        )
        request, sample = requests[index // n], index % n
        assert (result.request_id, result.prompt_token_ids, result.sample_index) == (
            request.request_id,
            request.prompt_token_ids,
            sample,
        ), (
            f"result {index} is sample {result.sample_index} of request {result.request_id!r} "
            f"(prompt {result.prompt_token_ids}), but position {index} belongs to sample {sample} "
            f"of request {request.request_id!r} (prompt {request.prompt_token_ids}): results "
            "must be request-major, in request order"
        )


def generate_checked(
    engine: RolloutEngine, requests: list[GenerationRequest], params: SamplingParams
) -> list[GenerationResult]:
    """``engine.generate(requests, params)``, checked to leave the caller's list as it was and to
    answer it request-major."""
    before = list(requests)
    results = engine.generate(requests, params)
    assert requests == before, (
        f"generate changed the caller's list of requests (it must not modify its argument): "
        f"prompts before {[r.prompt_token_ids for r in before]}, after "
        f"{[r.prompt_token_ids for r in requests]}"
    )
    assert_request_major(results, requests, params.n)
    return results


def greedy_outputs(
    engine: RolloutEngine, prompts: Sequence[tuple[int, ...]], **overrides: Any
) -> list[tuple[tuple[int, ...], FinishReason]]:
    """The engine's greedy completions (tokens, finish reason) of ``prompts``, in order."""
    params = SamplingParams(**{"temperature": 0.0, "max_new_tokens": NEW_TOKENS, **overrides})
    results = generate_checked(engine, requests_for(prompts), params)
    return [(r.output_token_ids, r.finish_reason) for r in results]


def assert_matches_reference(
    got: Sequence[tuple[tuple[int, ...], FinishReason]],
    prompts: Sequence[tuple[int, ...]],
    model_dir: Path,
    device: torch.device,
    what: str,
) -> None:
    for prompt, completion in zip(prompts, got, strict=True):
        want = reference_greedy(model_dir, device, prompt)
        assert completion == want, (
            f"{what}: prompt {prompt}: engine gave {completion}, the reference greedy decode of "
            f"{model_dir.name} gives {want}"
        )


def assert_close_logprobs(got: Sequence[float] | None, want: Sequence[float], where: str) -> None:
    assert got is not None, f"{where}: return_logprobs=True but the result has no logprobs"
    assert len(got) == len(want), f"{where}: {len(got)} logprobs for {len(want)} tokens"
    if not want:
        return
    worst = max(range(len(want)), key=lambda i: abs(got[i] - want[i]))
    assert abs(got[worst] - want[worst]) <= LOGPROB_TOLERANCE, (
        f"{where}: token {worst} has logprob {got[worst]:.7f}, the reference log_softmax gives "
        f"{want[worst]:.7f} (tolerance {LOGPROB_TOLERANCE})"
    )


def first_differing_tensor(
    held: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]
) -> str | None:
    """The first name whose held tensor is not exactly ``expected`` (cast to the held dtype)."""
    for name in sorted(expected):
        tensor = held.get(name)
        if tensor is None:
            return name
        if not torch.equal(tensor.detach().cpu(), expected[name].to(tensor.dtype)):
            return name
    return None


def assert_digests_equal(got: Mapping[str, str], want: Mapping[str, str], what: str) -> None:
    """``got == want``, or an error naming the tensors that differ and the first one's digests."""
    differ = sorted(name for name in set(got) | set(want) if got.get(name) != want.get(name))
    if differ:
        first = differ[0]
        raise AssertionError(
            f"{what}: {len(differ)} of {len(want)} tensor digests differ, e.g. {differ[:4]}; "
            f"{first!r} is {got.get(first)} where {want.get(first)} is expected"
        )
