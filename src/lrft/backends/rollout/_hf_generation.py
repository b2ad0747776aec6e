"""The ``hf`` engine's conversions between lrft's requests and transformers: a request's processed
media, a ``GenerationConfig`` from ``SamplingParams`` alone, the chosen tokens' logprobs from
raw logits, and each completion cut after its first stop id."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import GenerationConfig

from lrft.api.media import ProcessedMedia
from lrft.api.types import FinishReason, GenerationRequest, SamplingParams
from lrft.backends.rollout._hf_decode import PAD_ID, DecodeOutput


def processed_media(request: GenerationRequest) -> ProcessedMedia | None:
    """The tensors the model takes for ``request``'s media (the engine runs no processor)."""
    if request.media is None:
        return None
    if request.media.processed is None:
        raise ValueError(
            f"request {request.request_id!r} carries raw media only: the hf engine takes the "
            "model processor's tensors (ProcessedMedia; lrft.data.MediaProcessor makes them)"
        )
    return request.media.processed


def generation_config(params: SamplingParams, never: Sequence[int] = ()) -> GenerationConfig:
    """Every setting generate reads, from ``params``; nothing left to fill from model defaults.
    ``never``: ids never sampled (a media model's placeholders)."""
    stops = list(params.stop_token_ids)
    settings: dict[str, Any] = {
        "max_new_tokens": params.max_new_tokens,
        # transformers only suppresses EOS ids before min_new_tokens; with no stop ids there is
        # nothing to suppress (and it warns about the unused setting).
        "min_new_tokens": params.min_new_tokens if stops else 0,
        "eos_token_id": stops or None,
        "pad_token_id": PAD_ID,
        "num_beams": 1,
        "num_return_sequences": 1,
        "use_cache": True,
        "return_dict_in_generate": True,
        "output_logits": params.return_logprobs,
        "suppress_tokens": list(never) or None,
    }
    if params.greedy:
        return new_generation_config(do_sample=False, **settings)
    return new_generation_config(
        do_sample=True,
        temperature=params.temperature,
        top_k=params.top_k,  # 0 disables it in transformers too
        top_p=params.top_p,
        **settings,
    )


def new_generation_config(**settings: Any) -> GenerationConfig:
    # transformers 5 declares GenerationConfig.__init__(self, **kwargs) without annotations.
    return GenerationConfig(**settings)  # type: ignore[no-untyped-call]  # unannotated in transformers


def chosen_logprobs(
    raw_logits: Sequence[torch.Tensor], generated: torch.Tensor, params: SamplingParams
) -> torch.Tensor:
    """``log_softmax(logits / T)`` of each generated token, from the model's raw logits (before
    min-new-tokens suppression, top-k or top-p), shape ``(rows, steps)``."""
    temperature = 1.0 if params.greedy else params.temperature
    columns = []
    for step, logits in enumerate(raw_logits):
        logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)
        columns.append(logprobs.gather(1, generated[:, step, None])[:, 0])
    return torch.stack(columns, dim=1).cpu()


def decoded(
    output: DecodeOutput, params: SamplingParams
) -> list[tuple[list[int], FinishReason, list[float] | None]]:
    """The static loop's sequences, each its first ``lengths[i]`` tokens."""
    lengths = output.lengths.tolist()
    tokens = [row[:length] for row, length in zip(output.tokens.tolist(), lengths, strict=True)]
    logprobs = None
    if output.logprobs is not None:
        logprobs = [
            row[:length] for row, length in zip(output.logprobs.tolist(), lengths, strict=True)
        ]
    return completions(tokens, logprobs, params)


def completions(
    generated: list[list[int]], logprobs: list[list[float]] | None, params: SamplingParams
) -> list[tuple[list[int], FinishReason, list[float] | None]]:
    """Each row cut after its first stop id, with the reason and the logprobs it keeps."""
    stops = set(params.stop_token_ids)
    results: list[tuple[list[int], FinishReason, list[float] | None]] = []
    for row, tokens in enumerate(generated):
        length, reason = finish(tokens, stops)
        row_logprobs = None if logprobs is None else logprobs[row][:length]
        results.append((tokens[:length], reason, row_logprobs))
    return results


def finish(tokens: Sequence[int], stops: set[int]) -> tuple[int, FinishReason]:
    """The completion's length and why it ended: at the first stop id (kept) or at the limit.

    Stop ids are suppressed before ``min_new_tokens``, so the first one is the one generate
    stopped at; the tokens after it are padding of a finished row.
    """
    for position, token in enumerate(tokens):
        if token in stops:
            return position + 1, "stop"
    return len(tokens), "length"
