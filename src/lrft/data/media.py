"""Prompts with images: where the images go in the chat, and their media for a rollout.

- :func:`media_messages`: a row's chat with one ``{"type": "image"}`` part per image. A string
  input (or a message's string content) may mark where each image goes with ``<image>``;
  without markers the images come first in the first user message. A row whose markers or
  image parts do not match its images is an error naming the row.
- :class:`MediaLoader`: what a dataset keeps to give its samples their media when they are
  selected: the images are decoded and the model's processor runs then, so a large set of
  images is never held in memory decoded (loading checks every image once, and records each
  prompt's expanded ids; a sample whose media then expand differently, because a file
  changed since, is an error naming it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from lrft.api.media import MediaInputs
from lrft.data.errors import PromptDataError
from lrft.data.formatting import PromptFormat, chat_messages
from lrft.data.images import read_image
from lrft.data.processor import MediaProcessor
from lrft.data.types import PromptSample

IMAGE_MARKER = "<image>"
"""Marks where an image goes in a string input or a message's string content."""


def _parts(content: object) -> list[dict[str, Any]]:
    """A message's content as typed parts, ``<image>`` markers turned into image parts."""
    if isinstance(content, str):
        pieces = content.split(IMAGE_MARKER)
        parts: list[dict[str, Any]] = []
        for index, piece in enumerate(pieces):
            if index:
                parts.append({"type": "image"})
            if piece:
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
    value: object, images: int, prompt_format: PromptFormat, *, where: str
) -> list[dict[str, Any]]:
    """The chat of a row's input ``value`` with exactly ``images`` image parts (see module)."""
    messages = [
        {**message, "content": _parts(message["content"])}
        for message in chat_messages(value, prompt_format, where=where)
    ]
    found = sum(
        1 for message in messages for part in message["content"] if part.get("type") == "image"
    )
    if found == 0:
        users = [message for message in messages if message["role"] == "user"]
        if not users:
            raise PromptDataError(f"{where}: the row has images but no user message to put them in")
        users[0]["content"] = [{"type": "image"}] * images + users[0]["content"]
    elif found != images:
        raise PromptDataError(
            f"{where}: the prompt marks {found} image place(s) ({IMAGE_MARKER!r} or image "
            f"parts) but the row has {images} image(s)"
        )
    return messages


@attrs.frozen(kw_only=True)
class MediaLoader:
    """Decodes a sample's images and runs the model's processor on them (see module)."""

    source: str
    processor: MediaProcessor
    max_image_pixels: int

    def media(self, sample: PromptSample) -> MediaInputs:
        where = f"{self.source} row {sample.source_index}"
        images = [
            read_image(source, max_pixels=self.max_image_pixels, where=where)
            for source in sample.images
        ]
        processed = self.processor.process(sample.prompt_text, images=images)
        if processed.prompt_token_ids != sample.prompt_token_ids:
            raise PromptDataError(
                f"{where}: its images now expand to {len(processed.prompt_token_ids)} prompt "
                f"tokens, {sample.prompt_length} when the data was loaded (did an image file "
                f"change since?): {', '.join(s.describe() for s in sample.images)}"
            )
        return MediaInputs(images=images, processed=processed)

    def with_media(self, sample: PromptSample) -> PromptSample:
        """``sample`` with its media, decoded and processed; a sample without images as it is."""
        if not sample.images:
            return sample
        return attrs.evolve(sample, media=self.media(sample))
