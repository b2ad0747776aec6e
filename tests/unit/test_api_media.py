"""The multimodal value types: what they accept, what they refuse, and the capability gate."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from lrft.api import (
    AudioClip,
    CapabilityNotSupported,
    EngineCapabilities,
    GenerationRequest,
    MediaInputs,
    ProcessedMedia,
)
from lrft.backends.rollout._lifecycle import EngineLifecycle


def _processed(ids: tuple[int, ...] = (5, 9, 9, 7), images: int = 1) -> ProcessedMedia:
    return ProcessedMedia(
        prompt_token_ids=ids,
        tensors={"pixel_values": torch.zeros(4 * images, 6)},
        token_tensors={"mm_token_type_ids": torch.tensor([0, 1, 1, 0])},
        counts={"images": images},
    )


def test_images_are_pil_or_uint8_channel_first_tensors() -> None:
    pil = Image.new("RGB", (8, 6))
    tensor = torch.zeros(3, 6, 8, dtype=torch.uint8)
    media = MediaInputs(images=[pil, tensor])
    assert media.images == (pil, tensor)
    assert media.modalities == {"images"}
    assert media.count("images") == 2
    with pytest.raises(ValueError, match=r"image 0 as a tensor must be uint8 .* got torch.float32"):
        MediaInputs(images=[torch.zeros(3, 6, 8)])
    with pytest.raises(ValueError, match=r"shape \(6, 8\)"):
        MediaInputs(images=[torch.zeros(6, 8, dtype=torch.uint8)])
    with pytest.raises(TypeError, match=r"image 1 must be a PIL image .* got str"):
        MediaInputs(images=[pil, "cat.png"])


def test_audio_clips_are_mono_float_waveforms() -> None:
    clip = AudioClip(waveform=torch.zeros(16000), sampling_rate=16000)
    assert clip.seconds == 1.0
    assert MediaInputs(audio=[clip]).modalities == {"audio"}
    with pytest.raises(ValueError, match=r"1-D floating-point .* shape \(2, 10\)"):
        AudioClip(waveform=torch.zeros(2, 10), sampling_rate=16000)
    with pytest.raises(ValueError, match="sampling_rate must be a positive integer"):
        AudioClip(waveform=torch.zeros(10), sampling_rate=0)


def test_media_need_an_item_and_agreeing_counts() -> None:
    with pytest.raises(ValueError, match="at least one image or audio clip"):
        MediaInputs()
    processed = _processed(images=1)
    assert MediaInputs(processed=processed).modalities == {"images"}
    two = [Image.new("RGB", (4, 4))] * 2
    with pytest.raises(ValueError, match="processed media count 1 images, the raw media 2"):
        MediaInputs(images=two, processed=processed)


def test_processed_media_token_tensors_follow_the_prompt() -> None:
    with pytest.raises(ValueError, match=r"'mm_token_type_ids' has shape \(3,\); .* \(4,\)"):
        ProcessedMedia(
            prompt_token_ids=(1, 2, 3, 4),
            tensors={},
            token_tensors={"mm_token_type_ids": torch.zeros(3)},
        )
    with pytest.raises(ValueError, match="counts must map modalities"):
        ProcessedMedia(prompt_token_ids=(1,), tensors={}, counts={"video": 1})


def test_a_request_takes_the_processed_prompt_only() -> None:
    media = MediaInputs(processed=_processed())
    GenerationRequest(prompt_token_ids=(5, 9, 9, 7), media=media)
    with pytest.raises(ValueError, match=r"not the processed media's expanded prompt \(4 tokens\)"):
        GenerationRequest(prompt_token_ids=(5, 9, 7), request_id="q", media=media)


@pytest.mark.parametrize(
    ("declared", "media", "missing"),
    [
        ({}, MediaInputs(images=[Image.new("RGB", (4, 4))]), "images"),
        (
            {"images": True},
            MediaInputs(audio=[AudioClip(waveform=torch.zeros(4), sampling_rate=8)]),
            "audio",
        ),
    ],
)
def test_engines_refuse_modalities_they_do_not_declare(
    declared: dict[str, bool], media: MediaInputs, missing: str
) -> None:
    lifecycle = EngineLifecycle(
        backend="toy", capabilities=EngineCapabilities(**declared), specs={}
    )
    request = GenerationRequest(prompt_token_ids=(1, 2), request_id="r7", media=media)
    with pytest.raises(
        CapabilityNotSupported, match=f"toy does not support {missing}: request 'r7'"
    ) as raised:
        lifecycle.check_can_generate([GenerationRequest(prompt_token_ids=(1,)), request])
    assert raised.value.capability == missing
    lifecycle.check_can_generate([GenerationRequest(prompt_token_ids=(1,))])
