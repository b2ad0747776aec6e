"""Prompts with media: where the images and audio clips go in the chat, and their media for a
rollout.

- :func:`media_messages`: a row's chat with one ``{"type": "image"}`` part per image and one
  ``{"type": "audio"}`` part per clip. A string input (or a message's string content) may mark
  where each goes with ``<image>`` / ``<audio>``; without markers a modality's items come first
  in the first user message. A row whose markers or parts do not match its items is an error
  naming the row.
- :class:`MediaLoader`: what a dataset keeps to give its samples their media when they are
  selected: the images and clips are decoded and the model's processor runs then, so a large
  set of media is never held in memory decoded (loading checks every item once, and records
  each prompt's expanded ids; a sample whose media then expand differently, because a file
  changed since, is an error naming it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from lrft.api.media import AudioClip, Image, MediaInputs
from lrft.data.audio import AUDIO_MARKER, AudioSource, read_audio
from lrft.data.errors import PromptDataError
from lrft.data.formatting import PromptFormat, chat_messages
from lrft.data.images import ImageSource, read_image
from lrft.data.processor import MediaProcessor
from lrft.data.types import PromptSample

IMAGE_MARKER = "<image>"
"""Marks where an image goes in a string input or a message's string content."""

# A message part's type for each marker; the modality of each part type.
_MARKERS = {IMAGE_MARKER: "image", AUDIO_MARKER: "audio"}
_SPLIT = re.compile("(" + "|".join(re.escape(marker) for marker in _MARKERS) + ")")


def _parts(content: object) -> list[dict[str, Any]]:
    """A message's content as typed parts, ``<image>`` / ``<audio>`` markers turned into
    image and audio parts."""
    if isinstance(content, str):
        parts: list[dict[str, Any]] = []
        for piece in _SPLIT.split(content):
            if piece in _MARKERS:
                parts.append({"type": _MARKERS[piece]})
            elif piece:
                parts.append({"type": "text", "text": piece})
        return parts
    if isinstance(content, Sequence) and all(isinstance(part, Mapping) for part in content):
        expanded: list[dict[str, Any]] = []
        for part in content:
            if part.get("type") == "text" and isinstance(part.get("text"), str):
                expanded += _parts(part["text"])
            else:
                expanded.append(dict(part))
        return expanded
    return [{"type": "text", "text": str(content)}]


def media_messages(
    value: object, images: int, prompt_format: PromptFormat, *, where: str, audio: int = 0
) -> list[dict[str, Any]]:
    """The chat of a row's input ``value`` with exactly ``images`` image parts and ``audio``
    audio parts (see module)."""
    messages = [
        {**message, "content": _parts(message["content"])}
        for message in chat_messages(value, prompt_format, where=where)
    ]
    for kind, marker, count in (("image", IMAGE_MARKER, images), ("audio", AUDIO_MARKER, audio)):
        _place(messages, kind, marker, count, where)
    return messages


def _place(messages: list[dict[str, Any]], kind: str, marker: str, count: int, where: str) -> None:
    found = sum(
        1 for message in messages for part in message["content"] if part.get("type") == kind
    )
    if found == 0 and count:
        users = [message for message in messages if message["role"] == "user"]
        if not users:
            raise PromptDataError(
                f"{where}: the row has {kind} items but no user message to put them in"
            )
        users[0]["content"] = [{"type": kind}] * count + users[0]["content"]
    elif found != count:
        raise PromptDataError(
            f"{where}: the prompt marks {found} {kind} place(s) ({marker!r} or {kind} "
            f"parts) but the row has {count} {kind} item(s)"
        )


@attrs.frozen(kw_only=True)
class MediaLoader:
    """Decodes a sample's images and clips and runs the model's processor on them (see
    module)."""

    source: str
    processor: MediaProcessor
    max_image_pixels: int

    def read(
        self, images: Sequence[ImageSource], audio: Sequence[AudioSource], *, where: str
    ) -> tuple[list[Image], list[AudioClip]]:
        """The images and clips of one row, decoded (clips at the feature extractor's rate);
        ``where`` names the row in errors."""
        decoded: list[Image] = [
            read_image(source, max_pixels=self.max_image_pixels, where=where) for source in images
        ]
        rate = self.processor.sampling_rate
        clips = []
        if audio:
            assert rate is not None  # the processor's feature extractor was checked at load
            clips = [
                read_audio(
                    source,
                    sampling_rate=rate,
                    max_seconds=self.processor.max_audio_seconds,
                    where=where,
                )
                for source in audio
            ]
        return decoded, clips

    def media(self, sample: PromptSample) -> MediaInputs:
        where = f"{self.source} row {sample.source_index}"
        images, clips = self.read(sample.images, sample.audio, where=where)
        processed = self.processor.process(sample.prompt_text, images=images, audio=clips)
        if processed.prompt_token_ids != sample.prompt_token_ids:
            sources = [s.describe() for s in sample.images] + [s.describe() for s in sample.audio]
            raise PromptDataError(
                f"{where}: its media now expand to {len(processed.prompt_token_ids)} prompt "
                f"tokens, {sample.prompt_length} when the data was loaded (did a media file "
                f"change since?): {', '.join(sources)}"
            )
        return MediaInputs(images=images, audio=clips, processed=processed)

    def with_media(self, sample: PromptSample) -> PromptSample:
        """``sample`` with its media, decoded and processed; a sample without any as it is."""
        if not sample.images and not sample.audio:
            return sample
        return attrs.evolve(sample, media=self.media(sample))
