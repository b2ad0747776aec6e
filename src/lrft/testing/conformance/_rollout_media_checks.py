"""Rank-side checks of ``RolloutEngineSuite`` for engines that declare ``images``.

The engine serves the suite's tiny Qwen2-VL (``EngineModels.vlm_dir``); requests carry media
processed by the model's own processor. The reference is independent of any engine: the plain
transformers model of the same folder, a full forward per token on one unpadded prompt with
every media tensor, placing its tokens itself (3-D m-RoPE included). An engine that drops the
images, places the tokens after an image by plain 1-D positions, or swaps images between
requests gives other tokens, and the messages say which request and what was expected.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import attrs
import pytest
import torch

from lrft.api import (
    CapabilityNotSupported,
    EnginePart,
    GenerationRequest,
    GenerationResult,
    MediaInputs,
    ProcessedMedia,
    RolloutEngine,
    SamplingParams,
)
from lrft.data.processor import MediaProcessor
from lrft.testing.conformance._rollout_common import (
    BASE_VERSION,
    NEW_TOKENS,
    EngineModels,
    Suite,
    assert_close_logprobs,
    generate_checked,
    model_weights,
    rank_check,
    ready_engine,
    require_capability,
)
from lrft.testing.reference import (
    load_reference_vlm,
    media_greedy_continuation,
    media_token_logprobs,
)
from lrft.testing.vision_models import noise_image

PLACE = "<|vision_start|><|image_pad|><|vision_end|>"

#: (prompt text, image sizes) of the media requests: 1, 0, 2 and 1 images; the first and the
#: last have images of one size, so swapping them between the two changes no shape
MEDIA_PROMPTS: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = (
    (f"u:{PLACE}what;a:", ((56, 56),)),
    ("u:no image here;a:", ()),
    (f"u:{PLACE}and{PLACE};a:", ((28, 28), (84, 56))),
    (f"u:{PLACE}again;a:", ((56, 56),)),
)


@attrs.frozen(kw_only=True, eq=False)
class MediaPrompt:
    """One request of the media checks and what the reference makes of it."""

    request: GenerationRequest
    processed: ProcessedMedia | None  # None for the text-only prompt

    @property
    def images(self) -> int:
        return 0 if self.request.media is None else self.request.media.count("images")


@functools.cache
def _processor(model_dir: Path) -> MediaProcessor:
    return MediaProcessor.from_pretrained(model_dir)


def media_prompts(model_dir: Path, rank: int, *, image_seed: int = 0) -> list[MediaPrompt]:
    """``MEDIA_PROMPTS`` with noise images drawn from ``rank`` and ``image_seed``."""
    processor = _processor(model_dir)
    prompts = []
    for index, (text, sizes) in enumerate(MEDIA_PROMPTS):
        images = [
            noise_image(1000 * rank + 100 * image_seed + 10 * index + k, width, height)
            for k, (width, height) in enumerate(sizes)
        ]
        request_id = f"m{index}"
        if not images:
            ids = processor.tokenizer.encode(text)
            prompts.append(
                MediaPrompt(
                    request=GenerationRequest(prompt_token_ids=ids, request_id=request_id),
                    processed=None,
                )
            )
            continue
        processed = processor.process(text, images=images)
        media = MediaInputs(images=images, processed=processed)
        request = GenerationRequest(
            prompt_token_ids=processed.prompt_token_ids, request_id=request_id, media=media
        )
        prompts.append(MediaPrompt(request=request, processed=processed))
    return prompts


@functools.cache
def _reference(model_dir: Path, device: torch.device) -> torch.nn.Module:
    return load_reference_vlm(model_dir, device)


def reference_media_greedy(
    model_dir: Path, device: torch.device, prompt: MediaPrompt
) -> tuple[int, ...]:
    model = _reference(model_dir, device)
    continuation = media_greedy_continuation(
        model, prompt.processed, prompt.request.prompt_token_ids, NEW_TOKENS
    )
    return tuple(continuation)


def _greedy(
    engine: RolloutEngine, prompts: Sequence[MediaPrompt], *, logprobs: bool = False
) -> list[GenerationResult]:
    params = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS, return_logprobs=logprobs)
    return generate_checked(engine, [prompt.request for prompt in prompts], params)


def _describe(prompt: MediaPrompt) -> str:
    return f"request {prompt.request.request_id!r} ({prompt.images} image(s))"


def assert_media_matches_reference(
    results: Sequence[GenerationResult],
    prompts: Sequence[MediaPrompt],
    model_dir: Path,
    device: torch.device,
    what: str,
) -> None:
    for prompt, result in zip(prompts, results, strict=True):
        want = reference_media_greedy(model_dir, device, prompt)
        assert result.output_token_ids == want, (
            f"{what}: {_describe(prompt)}: the engine gave {result.output_token_ids}, the "
            f"reference (a plain transformers forward per token with the request's image "
            f"tensors, the model placing its own 3-D m-RoPE positions) gives {want}; an "
            "engine that drops the images, places tokens by 1-D positions, mixes up the "
            "requests' images or samples a media placeholder id differs here"
        )


def _media_engine(suite: Suite, models: EngineModels, device: torch.device) -> RolloutEngine:
    """The suite's engine on the tiny Qwen2-VL; a skip naming ``images`` when the engine lacks
    the capability (or refuses to serve the model at all with ``CapabilityNotSupported``)."""
    try:
        engine = ready_engine(suite, models, device, models.vlm_dir)
    except CapabilityNotSupported as refused:
        pytest.skip(f"{suite.__name__} engine lacks capability {refused.capability}: {refused}")
    require_capability(engine, "images")
    return engine


@rank_check
def check_image_greedy_matches_reference(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """Greedy tokens and logprobs of one batch mixing prompts with 0, 1 and 2 images equal the
    reference's, request by request."""
    engine = _media_engine(suite, models, device)
    prompts = media_prompts(models.vlm_dir, rank)
    results = _greedy(engine, prompts, logprobs=True)
    assert_media_matches_reference(results, prompts, models.vlm_dir, device, "one mixed batch")
    model = _reference(models.vlm_dir, device)
    for prompt, result in zip(prompts, results, strict=True):
        if prompt.processed is None:
            continue
        want = media_token_logprobs(model, prompt.processed, result.output_token_ids)
        assert_close_logprobs(result.logprobs, want, f"{_describe(prompt)} logprobs")


@rank_check
def check_images_change_the_output(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """The same prompts with other images give the reference's other outputs: the images reach
    the model (an engine that ignores them gives one answer for both)."""
    engine = _media_engine(suite, models, device)
    first = media_prompts(models.vlm_dir, rank, image_seed=0)
    second = media_prompts(models.vlm_dir, rank, image_seed=1)
    pictured = [index for index, prompt in enumerate(first) if prompt.images]
    wanted = [
        (
            reference_media_greedy(models.vlm_dir, device, first[i]),
            reference_media_greedy(models.vlm_dir, device, second[i]),
        )
        for i in pictured
    ]
    assert any(a != b for a, b in wanted), (
        "the suite's own images do not change the reference's output: the check cannot tell "
        "an engine that ignores them (a fault of the suite, not of the engine)"
    )
    got_first = _greedy(engine, [first[i] for i in pictured])
    got_second = _greedy(engine, [second[i] for i in pictured])
    for index, (a, b), x, y in zip(pictured, wanted, got_first, got_second, strict=True):
        if a == b:
            continue
        assert x.output_token_ids != y.output_token_ids, (
            f"{_describe(first[index])}: two different images gave the same output "
            f"{x.output_token_ids}, where the reference gives {a} and {b}: the engine does not "
            "condition on the images"
        )
        assert (x.output_token_ids, y.output_token_ids) == (a, b), (
            f"{_describe(first[index])}: the engine gave {x.output_token_ids} and "
            f"{y.output_token_ids} for the two images, the reference {a} and {b}"
        )


@rank_check
def check_image_batch_independence(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """Each media request alone, and the batch in reverse order, give the same greedy tokens as
    the reference: nothing of one request's images leaks into another's."""
    engine = _media_engine(suite, models, device)
    prompts = media_prompts(models.vlm_dir, rank)
    for prompt in prompts:
        (alone,) = _greedy(engine, [prompt])
        assert_media_matches_reference([alone], [prompt], models.vlm_dir, device, "alone")
    reverse = prompts[::-1]
    assert_media_matches_reference(
        _greedy(engine, reverse), reverse, models.vlm_dir, device, "in reverse order"
    )
    doubled = [*prompts, *prompts]
    assert_media_matches_reference(
        _greedy(engine, doubled), doubled, models.vlm_dir, device, "each twice in one batch"
    )


@rank_check
def check_image_outputs_survive_the_lifecycle(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """Sleeping at each declared level, waking (and at level 2 loading the weights again) give
    the same image-conditioned outputs."""
    engine = _media_engine(suite, models, device)
    prompts = media_prompts(models.vlm_dir, rank)
    weights = list(model_weights(models.vlm_dir).items())
    for level in sorted(engine.capabilities.sleep_levels):
        engine.sleep(level)
        engine.wake([EnginePart.WEIGHTS])
        if level == 2:
            engine.load_weights(weights, version=BASE_VERSION + level)
        engine.wake()
        assert_media_matches_reference(
            _greedy(engine, prompts),
            prompts,
            models.vlm_dir,
            device,
            f"after sleep({level}) and wake{' and a load' if level == 2 else ''}",
        )
    engine.load_weights(weights, version=BASE_VERSION + 10)
    assert_media_matches_reference(
        _greedy(engine, prompts), prompts, models.vlm_dir, device, "after load_weights"
    )
