"""What the media checks of ``RolloutEngineSuite`` share: the modalities (:class:`MediaKind`), the
requests with media and their independent reference (the plain transformers model of the same
folder, a full forward per token on one unpadded prompt with every media tensor), and the
messages that name a request and its media."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
import pytest
import torch

from lrft.api import (
    AudioClip,
    CapabilityNotSupported,
    GenerationRequest,
    GenerationResult,
    LrftError,
    MediaInputs,
    ProcessedMedia,
    RolloutEngine,
    SamplingParams,
)
from lrft.api.media import Image, Modality
from lrft.data.processor import MediaProcessor
from lrft.testing.audio_models import tone
from lrft.testing.conformance._rollout_asserts import (
    generate_checked,
)
from lrft.testing.conformance._rollout_common import (
    NEW_TOKENS,
    EngineModels,
    Suite,
    ready_engine,
    require_capability,
)
from lrft.testing.reference import (
    load_reference_vlm,
    media_greedy_continuation,
)
from lrft.testing.vision_models import noise_image

PLACE = "<|vision_start|><|image_pad|><|vision_end|>"
AUDIO_PLACE = "<|audio_bos|><|AUDIO|><|audio_eos|>"

#: (prompt text, image sizes) of the image requests: 1, 0, 2 and 1 images; the first and the
#: last have images of one size, so swapping them between the two changes no shape
MEDIA_PROMPTS: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = (
    (f"u:{PLACE}what;a:", ((56, 56),)),
    ("u:no image here;a:", ()),
    (f"u:{PLACE}and{PLACE};a:", ((28, 28), (84, 56))),
    (f"u:{PLACE}again;a:", ((56, 56),)),
)

#: (prompt text, clip lengths in seconds) of the audio requests: 1, 0, 2 and 1 clips; the
#: first and the last of one length (7 audio tokens each)
AUDIO_PROMPTS: tuple[tuple[str, tuple[float, ...]], ...] = (
    (f"u:{AUDIO_PLACE}what;a:", (0.3,)),
    ("u:no sound here;a:", ()),
    (f"u:{AUDIO_PLACE}and{AUDIO_PLACE};a:", (0.1, 0.5)),
    (f"u:{AUDIO_PLACE}again;a:", (0.3,)),
)


@attrs.frozen(kw_only=True)
class MediaKind:
    """One modality as the checks use it: its capability, the model folder that takes it, its
    requests' texts with one item spec per placeholder, and how an item is made from a seed."""

    modality: Modality
    noun: str
    folder: Callable[[EngineModels], Path]
    prompts: tuple[tuple[str, tuple[object, ...]], ...]
    make: Callable[[int, object], Image | AudioClip]
    wrong: str  # the faults the greedy check names
    reference: str  # how the reference takes the media, for messages


def _image(seed: int, spec: object) -> Image:
    assert isinstance(spec, tuple), f"an image spec is (width, height), got {spec!r}"
    width, height = spec
    return noise_image(seed, width, height)


def _clip(seed: int, spec: object) -> AudioClip:
    assert isinstance(spec, float), f"a clip spec is its length in seconds, got {spec!r}"
    return tone(seed, spec)


IMAGES = MediaKind(
    modality="images",
    noun="image",
    folder=lambda models: models.vlm_dir,
    prompts=MEDIA_PROMPTS,
    make=_image,
    wrong="drops the images, places tokens by 1-D positions, mixes up the requests' images",
    reference=(
        "pixel_values and image_grid_thw, the model placing its own positions (Qwen2-VL's 3-D "
        "m-RoPE)"
    ),
)
AUDIO = MediaKind(
    modality="audio",
    noun="audio clip",
    folder=lambda models: models.audio_dir,
    prompts=AUDIO_PROMPTS,
    make=_clip,
    wrong="drops the audio features or their mask, mixes up the requests' clips",
    reference="input_features and feature_attention_mask (Qwen2-Audio's encoder)",
)
_KINDS = {kind.modality: kind for kind in (IMAGES, AUDIO)}


@attrs.frozen(kw_only=True, eq=False)
class MediaPrompt:
    """One request of the media checks and what the reference makes of it."""

    request: GenerationRequest
    processed: ProcessedMedia | None  # None for the text-only prompt
    modality: Modality = "images"

    @property
    def images(self) -> int:
        return self.items

    @property
    def items(self) -> int:
        return 0 if self.request.media is None else self.request.media.count(self.modality)


@functools.cache
def _processor(model_dir: Path) -> MediaProcessor:
    return MediaProcessor.from_pretrained(model_dir)


def media_prompts(
    model_dir: Path, rank: int, *, image_seed: int = 0, kind: MediaKind = IMAGES
) -> list[MediaPrompt]:
    """``kind``'s prompts (``MEDIA_PROMPTS`` for images, ``AUDIO_PROMPTS`` for audio) with
    noise images or tone clips drawn from ``rank`` and ``image_seed``."""
    processor = _processor(model_dir)
    prompts = []
    for index, (text, specs) in enumerate(kind.prompts):
        items = [
            kind.make(1000 * rank + 100 * image_seed + 10 * index + k, spec)
            for k, spec in enumerate(specs)
        ]
        request_id = f"m{index}"
        if not items:
            ids = processor.tokenizer.encode(text)
            prompts.append(
                MediaPrompt(
                    request=GenerationRequest(prompt_token_ids=ids, request_id=request_id),
                    processed=None,
                    modality=kind.modality,
                )
            )
            continue
        if kind.modality == "audio":
            clips = [item for item in items if isinstance(item, AudioClip)]
            processed = processor.process(text, audio=clips)
            media = MediaInputs(audio=clips, processed=processed)
        else:
            images = [item for item in items if not isinstance(item, AudioClip)]
            processed = processor.process(text, images=images)
            media = MediaInputs(images=images, processed=processed)
        request = GenerationRequest(
            prompt_token_ids=processed.prompt_token_ids, request_id=request_id, media=media
        )
        prompts.append(MediaPrompt(request=request, processed=processed, modality=kind.modality))
    return prompts


@functools.cache
def media_reference(model_dir: Path, device: torch.device) -> torch.nn.Module:
    return load_reference_vlm(model_dir, device)


def reference_media_greedy(
    model_dir: Path, device: torch.device, prompt: MediaPrompt
) -> tuple[int, ...]:
    model = media_reference(model_dir, device)
    continuation = media_greedy_continuation(
        model, prompt.processed, prompt.request.prompt_token_ids, NEW_TOKENS
    )
    return tuple(continuation)


def greedy_media(
    engine: RolloutEngine, prompts: Sequence[MediaPrompt], *, logprobs: bool = False
) -> list[GenerationResult]:
    params = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS, return_logprobs=logprobs)
    return generate_media(engine, prompts, params)


def generate_media(
    engine: RolloutEngine, prompts: Sequence[MediaPrompt], params: SamplingParams
) -> list[GenerationResult]:
    """``generate_checked`` of the prompts' requests. Any other error than lrft's becomes a
    failure that names the requests and their media; one about tensor sizes says what it
    means: the engine handed the model media that are not its rows'."""
    try:
        return generate_checked(engine, [prompt.request for prompt in prompts], params)
    except (AssertionError, LrftError):
        raise
    except Exception as error:
        batch = ", ".join(describe(prompt) for prompt in prompts)
        sizes = any(word in str(error) for word in ("size", "match", "shape"))
        meaning = (
            ": the media tensors given to the model do not fit the prompts given with them; "
            "an engine that splits a batch into chunks must give each chunk exactly its own "
            "rows' media, in their order"
            if sizes
            else ""
        )
        raise AssertionError(
            f"generate() of a batch of {len(prompts)} requests with media ({batch}; "
            f"{params.n} sample(s) each) raised {type(error).__name__}: {error}{meaning}"
        ) from error


def describe(prompt: MediaPrompt) -> str:
    noun = _KINDS[prompt.modality].noun
    return f"request {prompt.request.request_id!r} ({prompt.items} {noun}(s))"


def assert_media_matches_reference(
    results: Sequence[GenerationResult],
    prompts: Sequence[MediaPrompt],
    model_dir: Path,
    device: torch.device,
    what: str,
) -> None:
    for prompt, result in zip(prompts, results, strict=True):
        want = reference_media_greedy(model_dir, device, prompt)
        kind = _KINDS[prompt.modality]
        assert result.output_token_ids == want, (
            f"{what}: {describe(prompt)}: the engine gave {result.output_token_ids}, the "
            f"reference (a plain transformers forward per token with the request's "
            f"{kind.reference}) gives {want}; an engine that {kind.wrong} or samples a media "
            "placeholder id differs here"
        )


def media_engine(
    kind: MediaKind, suite: Suite, models: EngineModels, device: torch.device
) -> RolloutEngine:
    """The suite's engine on ``kind``'s tiny model; a skip naming the modality when the engine
    lacks the capability (or refuses to serve the model at all with ``CapabilityNotSupported``)."""
    try:
        engine = ready_engine(suite, models, device, kind.folder(models))
    except CapabilityNotSupported as refused:
        pytest.skip(f"{suite.__name__} engine lacks capability {refused.capability}: {refused}")
    require_capability(engine, kind.modality)
    return engine
