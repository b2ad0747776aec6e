"""Rank-side checks of ``RolloutEngineSuite`` for engines that declare ``images`` or ``audio``.

One set of checks, run per modality (:class:`MediaKind`): the engine serves the suite's tiny
Qwen2-VL (``EngineModels.vlm_dir``) for ``images`` and its tiny Qwen2-Audio
(``EngineModels.audio_dir``) for ``audio``; requests carry media processed by the model's own
processor. The reference is independent of any engine: the plain transformers model of the same
folder, a full forward per token on one unpadded prompt with every media tensor, placing its
tokens itself (Qwen2-VL's 3-D m-RoPE included). An engine that drops the media, places the
tokens after an image by plain 1-D positions, or swaps media between requests gives other
tokens, and the messages say which request and what was expected.
"""

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
    EnginePart,
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
from lrft.testing.conformance._rollout_common import (
    BASE_VERSION,
    NEW_TOKENS,
    EngineModels,
    Suite,
    assert_close_logprobs,
    generate_checked,
    model_weights,
    ready_engine,
    require_capability,
    rollout_check,
)
from lrft.testing.reference import (
    load_reference_vlm,
    media_greedy_continuation,
    media_token_logprobs,
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


def _greedy(
    engine: RolloutEngine, prompts: Sequence[MediaPrompt], *, logprobs: bool = False
) -> list[GenerationResult]:
    params = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS, return_logprobs=logprobs)
    return generate_media(engine, prompts, params)


def generate_media(
    engine: RolloutEngine, prompts: Sequence[MediaPrompt], params: SamplingParams
) -> list[GenerationResult]:
    """``generate_checked`` of the prompts' requests. An error from inside the model (a tensor
    size that does not match, raised by transformers or torch) becomes a failure that names
    the requests and their media: the engine handed the model media that are not its rows'."""
    try:
        return generate_checked(engine, [prompt.request for prompt in prompts], params)
    except (AssertionError, LrftError):
        raise
    except Exception as error:
        batch = ", ".join(describe(prompt) for prompt in prompts)
        raise AssertionError(
            f"generate() of a batch of {len(prompts)} requests with media ({batch}; "
            f"{params.n} sample(s) each) raised {type(error).__name__} inside the model: "
            f"{error}. The media tensors the model was given do not match the placeholders of "
            "the prompts it was given: an engine that splits a batch into chunks must give "
            "each chunk exactly its own rows' media, in their order"
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


def _greedy_matches_reference(
    kind: MediaKind, suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = media_engine(kind, suite, models, device)
    folder = kind.folder(models)
    prompts = media_prompts(folder, rank, kind=kind)
    results = _greedy(engine, prompts, logprobs=True)
    assert_media_matches_reference(results, prompts, folder, device, "one mixed batch")
    model = media_reference(folder, device)
    for prompt, result in zip(prompts, results, strict=True):
        if prompt.processed is None:
            continue
        want = media_token_logprobs(model, prompt.processed, result.output_token_ids)
        assert_close_logprobs(result.logprobs, want, f"{describe(prompt)} logprobs")


def _media_change_the_output(
    kind: MediaKind, suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = media_engine(kind, suite, models, device)
    folder = kind.folder(models)
    first = media_prompts(folder, rank, image_seed=0, kind=kind)
    second = media_prompts(folder, rank, image_seed=1, kind=kind)
    with_media = [index for index, prompt in enumerate(first) if prompt.items]
    wanted = [
        (
            reference_media_greedy(folder, device, first[i]),
            reference_media_greedy(folder, device, second[i]),
        )
        for i in with_media
    ]
    assert any(a != b for a, b in wanted), (
        f"the suite's own {kind.modality} do not change the reference's output: the check "
        "cannot tell an engine that ignores them (a fault of the suite, not of the engine)"
    )
    got_first = _greedy(engine, [first[i] for i in with_media])
    got_second = _greedy(engine, [second[i] for i in with_media])
    for index, (a, b), x, y in zip(with_media, wanted, got_first, got_second, strict=True):
        if a == b:
            continue
        if x.output_token_ids == y.output_token_ids == a:
            raise AssertionError(
                f"{describe(first[index])}: asked again with another {kind.noun} (a later "
                f"call, the same prompt ids), the engine gave the first {kind.noun}'s output "
                f"{a} again, where the reference gives {b}: it answered from something cached "
                f"for the earlier call (results or {kind.noun} features kept by prompt ids, "
                f"which are equal for two {kind.noun}s of one size)"
            )
        assert x.output_token_ids != y.output_token_ids, (
            f"{describe(first[index])}: two different {kind.noun}s gave the same output "
            f"{x.output_token_ids}, where the reference gives {a} and {b}: the engine does not "
            f"condition on the {kind.modality}"
        )
        assert (x.output_token_ids, y.output_token_ids) == (a, b), (
            f"{describe(first[index])}: the engine gave {x.output_token_ids} and "
            f"{y.output_token_ids} for the two {kind.noun}s, the reference {a} and {b}"
        )


def _media_batch_independence(
    kind: MediaKind, suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = media_engine(kind, suite, models, device)
    folder = kind.folder(models)
    prompts = media_prompts(folder, rank, kind=kind)
    for prompt in prompts:
        (alone,) = _greedy(engine, [prompt])
        assert_media_matches_reference([alone], [prompt], folder, device, "alone")
    reverse = prompts[::-1]
    assert_media_matches_reference(
        _greedy(engine, reverse), reverse, folder, device, "in reverse order"
    )
    doubled = [*prompts, *prompts]
    assert_media_matches_reference(
        _greedy(engine, doubled), doubled, folder, device, "each twice in one batch"
    )


def _media_outputs_survive_the_lifecycle(
    kind: MediaKind, suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    engine = media_engine(kind, suite, models, device)
    folder = kind.folder(models)
    prompts = media_prompts(folder, rank, kind=kind)
    weights = list(model_weights(folder).items())
    for level in sorted(engine.capabilities.sleep_levels):
        engine.sleep(level)
        engine.wake([EnginePart.WEIGHTS])
        if level == 2:
            engine.load_weights(weights, version=BASE_VERSION + level)
        engine.wake()
        assert_media_matches_reference(
            _greedy(engine, prompts),
            prompts,
            folder,
            device,
            f"after sleep({level}) and wake{' and a load' if level == 2 else ''}",
        )
    engine.load_weights(weights, version=BASE_VERSION + 10)
    assert_media_matches_reference(
        _greedy(engine, prompts), prompts, folder, device, "after load_weights"
    )


# --- the checks, per modality ----------------------------------------------------------------


@rollout_check
def check_image_greedy_matches_reference(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """Greedy tokens and logprobs of one batch mixing prompts with 0, 1 and 2 images equal the
    reference's, request by request."""
    _greedy_matches_reference(IMAGES, suite, models, rank, device)


@rollout_check
def check_images_change_the_output(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """The same prompts with other images give the reference's other outputs: the images reach
    the model (an engine that ignores them gives one answer for both)."""
    _media_change_the_output(IMAGES, suite, models, rank, device)


@rollout_check
def check_image_batch_independence(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """Each image request alone, and the batch in reverse order, give the same greedy tokens as
    the reference: nothing of one request's images leaks into another's."""
    _media_batch_independence(IMAGES, suite, models, rank, device)


@rollout_check
def check_image_outputs_survive_the_lifecycle(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """Sleeping at each declared level, waking (and at level 2 loading the weights again) give
    the same image-conditioned outputs."""
    _media_outputs_survive_the_lifecycle(IMAGES, suite, models, rank, device)


@rollout_check
def check_audio_greedy_matches_reference(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """Greedy tokens and logprobs of one batch mixing prompts with 0, 1 and 2 audio clips equal
    the reference's, request by request."""
    _greedy_matches_reference(AUDIO, suite, models, rank, device)


@rollout_check
def check_audio_changes_the_output(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """The same prompts with other clips give the reference's other outputs: the audio reaches
    the model."""
    _media_change_the_output(AUDIO, suite, models, rank, device)


@rollout_check
def check_audio_batch_independence(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """Each audio request alone, reversed and doubled in one batch, gives the reference's
    greedy tokens: nothing of one request's clips leaks into another's."""
    _media_batch_independence(AUDIO, suite, models, rank, device)


@rollout_check
def check_audio_outputs_survive_the_lifecycle(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """Sleep, wake (and a load at level 2) keep the audio-conditioned outputs."""
    _media_outputs_survive_the_lifecycle(AUDIO, suite, models, rank, device)
