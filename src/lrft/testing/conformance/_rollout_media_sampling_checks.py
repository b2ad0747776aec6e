"""Rank-side checks of ``RolloutEngineSuite`` for media on the sampled path, the one RL takes
(the media checks of ``_rollout_media_checks`` decode greedily): each sampled token's logprob is
the reference's with the request's media, no sample holds a media placeholder id, and the same
seed gives the same samples.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from lrft.api import SamplingParams
from lrft.testing.conformance._rollout_asserts import (
    assert_close_logprobs,
)
from lrft.testing.conformance._rollout_common import (
    EngineModels,
    rollout_check,
)
from lrft.testing.conformance._rollout_media_common import (
    AUDIO,
    IMAGES,
    MediaKind,
    describe,
    generate_media,
    media_engine,
    media_prompts,
    media_reference,
)
from lrft.testing.reference import (
    media_placeholder_ids,
    media_token_logprobs,
    token_logprobs,
)

if TYPE_CHECKING:
    from lrft.testing.conformance._rollout_common import Suite

SAMPLED = SamplingParams(n=2, temperature=0.8, top_k=40, max_new_tokens=8, seed=17)


def _sampled_with_media(
    kind: MediaKind, suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = media_engine(kind, suite, models, device)
    folder = kind.folder(models)
    prompts = media_prompts(folder, rank, kind=kind)
    logprobs = "returns_logprobs" in engine.capabilities.names()
    params = SamplingParams(
        n=SAMPLED.n, temperature=SAMPLED.temperature, top_k=SAMPLED.top_k,
        max_new_tokens=SAMPLED.max_new_tokens, seed=SAMPLED.seed, return_logprobs=logprobs,
    )  # fmt: skip
    results = generate_media(engine, prompts, params)
    again = generate_media(engine, prompts, params)
    model = media_reference(folder, device)
    never = set(media_placeholder_ids(model))
    setting = f"sampled (T={params.temperature}, top_k={params.top_k}, seed {params.seed})"
    for index, (result, repeated) in enumerate(zip(results, again, strict=True)):
        prompt = prompts[index // params.n]
        where = f"{setting}: {describe(prompt)} sample {result.sample_index}"
        placeholders = [(j, t) for j, t in enumerate(result.output_token_ids) if t in never]
        assert not placeholders, (
            f"{where} gave {result.output_token_ids}, holding the media placeholder id "
            f"{placeholders[0][1]} at position {placeholders[0][0]}: an engine never samples "
            "one (a response holding it could not be read back with the prompt's media)"
        )
        assert repeated.output_token_ids == result.output_token_ids, (
            f"{where}: the same seed gave {result.output_token_ids}, then "
            f"{repeated.output_token_ids}: seeded sampling with media must be reproducible"
        )
        if not logprobs:
            continue
        if prompt.processed is None:
            want = token_logprobs(
                model, result.prompt_token_ids, result.output_token_ids, params.temperature
            )
        else:
            want = media_token_logprobs(
                model, prompt.processed, result.output_token_ids, params.temperature
            )
        assert_close_logprobs(
            result.logprobs,
            want,
            f"{where}, against the reference with the request's {kind.reference} (an engine "
            f"that samples without the {kind.modality} differs here)",
        )


@rollout_check
def check_image_sampled_logprobs(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """Sampling a batch mixing prompts with 0, 1 and 2 images: each token's logprob is the
    reference's with the request's images, no image placeholder is sampled, and the same seed
    gives the same samples."""
    _sampled_with_media(IMAGES, suite, models, rank, device)


@rollout_check
def check_audio_sampled_logprobs(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """The same for a batch mixing prompts with 0, 1 and 2 audio clips."""
    _sampled_with_media(AUDIO, suite, models, rank, device)
