"""The media columns of a prompt row: the processor they need, and each row's items within its
per-prompt limit (read by :func:`lrft.data.load_prompt_dataset`)."""

from __future__ import annotations

from pathlib import Path

from lrft.api.errors import ConfigError
from lrft.data.audio import AudioSource, audio_sources
from lrft.data.errors import PromptDataError
from lrft.data.images import ImageSource, image_sources
from lrft.data.processor import MediaProcessor


def check_media_processor(
    images_key: str | None, audios_key: str | None, processor: MediaProcessor | None
) -> None:
    """``ConfigError`` unless ``processor`` can take the media the keys name: an image
    processor for ``images_key``, a feature extractor with a sampling rate for ``audios_key``."""
    keys = [
        (option, key, modality, part)
        for option, key, modality, part in (
            ("images_key", images_key, "images", "image processor"),
            ("audios_key", audios_key, "audio", "feature extractor"),
        )
        if key is not None
    ]
    for option, key, modality, part in keys:
        if processor is None:
            raise ConfigError(
                f"{option}={key!r} needs the model's processor (lrft.data.MediaProcessor"
                ".from_pretrained(model folder)) to place and expand its media"
            )
        if modality not in processor.modalities:
            raise ConfigError(
                f"{option}={key!r}, but the model's processor "
                f"({type(processor.processor).__name__}) has no {part}"
            )
        if modality == "audio" and processor.sampling_rate is None:
            raise ConfigError(
                f"{option}={key!r}, but the model's feature extractor declares no sampling_rate "
                "to read the clips at"
            )


def row_images(
    value: object, key: str, limit: int | None, *, base: Path, where: str
) -> tuple[ImageSource, ...]:
    """The images of a row's ``key`` column ``value``; more than ``limit`` is an error."""
    images = image_sources(value, base=base, where=where, key=key)
    if limit is not None and len(images) > limit:
        raise PromptDataError(
            f"{where}: {len(images)} images, more than limit_mm_image_per_prompt={limit}"
        )
    return images


def row_audio(
    value: object, key: str, limit: int | None, *, base: Path, where: str
) -> tuple[AudioSource, ...]:
    """The clips of a row's ``key`` column ``value``; more than ``limit`` is an error."""
    clips = audio_sources(value, base=base, where=where, key=key)
    if limit is not None and len(clips) > limit:
        raise PromptDataError(
            f"{where}: {len(clips)} audio clips, more than limit_mm_audio_per_prompt={limit}"
        )
    return clips
