"""The model's own processor: its chat template with media placeholders, its image processor
and feature extractor, and the expanded prompt ids they make.

:func:`load_processor` is ``AutoProcessor.from_pretrained``, with one fallback: transformers
builds a Qwen2-VL-family processor only with its video processor, which needs torchvision
(transformers 5.24 raises ``ImportError`` without it, although its image processor falls back
to a Pillow implementation). lrft reads no video, so it then builds the same processor class
without its video processor: every other part is the checkpoint's own.

:class:`MediaProcessor` turns one prompt (chat messages whose content lists hold ``{"type":
"image"}`` / ``{"type": "audio"}`` parts) and its media into :class:`~lrft.api.ProcessedMedia`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch

from lrft.api.errors import ConfigError
from lrft.api.media import AudioClip, Image, Modality, ProcessedMedia

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
    from transformers.processing_utils import ProcessorMixin

# Sub-processors that lrft never calls and whose transformers classes need torchvision.
_UNUSED_ATTRIBUTES = ("video_processor",)

# The processor's outputs that describe the text (lrft lays out its own masks and ids).
_TEXT_OUTPUTS = ("input_ids", "attention_mask")

# Outputs with one row per media item, never per prompt token, whatever their width: a
# Qwen2-Audio clip's feature mask is (1, frames), which a prompt of as many tokens would match.
_ITEM_OUTPUTS = ("feature_attention_mask",)


class Processor(Protocol):
    """The part of a transformers processor lrft calls."""

    tokenizer: PreTrainedTokenizerBase
    chat_template: str | None

    def __call__(self, **kwargs: Any) -> Mapping[str, Any]: ...

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


def load_processor(directory: str | os.PathLike[str]) -> Processor:
    """The processor of the model folder ``directory`` (see the module doc for the fallback)."""
    from transformers import AutoProcessor

    try:
        processor: Processor = AutoProcessor.from_pretrained(directory)  # type: ignore[no-untyped-call]  # unannotated in transformers
    except ImportError as error:
        if "torchvision" not in str(error).lower():
            raise
        return _processor_without_video(Path(directory), error)
    return processor


def _processor_class_name(directory: Path) -> str | None:
    for name in ("processor_config.json", "preprocessor_config.json"):
        path = directory / name
        if path.is_file():
            value = json.loads(path.read_text(encoding="utf-8")).get("processor_class")
            if isinstance(value, str):
                return value
    return None


def _processor_without_video(directory: Path, error: ImportError) -> Processor:
    import transformers

    name = _processor_class_name(directory)
    cls = None if name is None else getattr(transformers, name, None)
    if not isinstance(cls, type):
        raise ImportError(
            f"the processor of {str(directory)!r} needs torchvision ({error}), and its class "
            f"{name!r} could not be found to build it without its video processor: "
            "pip install torchvision"
        ) from error
    base = cast("type[ProcessorMixin]", cls)

    class WithoutVideo(base):  # type: ignore[misc,valid-type]  # a class made at run time
        """The checkpoint's processor class minus the sub-processors lrft never calls."""

        @classmethod
        def get_attributes(cls) -> list[str]:
            attributes: list[str] = super().get_attributes()
            return [name for name in attributes if name not in _UNUSED_ATTRIBUTES]

    WithoutVideo.__name__ = WithoutVideo.__qualname__ = f"{base.__name__}WithoutVideo"
    processor: Processor = WithoutVideo.from_pretrained(directory)
    return processor


def _per_token(outputs: Mapping[str, Any], length: int) -> dict[str, torch.Tensor]:
    """Outputs with one value per prompt token (shape ``(1, length)``), as ``(length,)``."""
    return {
        name: value[0]
        for name, value in outputs.items()
        if name not in _TEXT_OUTPUTS
        and name not in _ITEM_OUTPUTS
        and isinstance(value, torch.Tensor)
        and tuple(value.shape) == (1, length)
    }


class MediaProcessor:
    """Runs a model's processor on one prompt at a time (see the module doc).

    ``sampling_rate``: the rate the feature extractor expects, which audio clips must be at;
    ``max_audio_seconds``: the longest clip it takes whole.
    """

    def __init__(self, processor: Processor) -> None:
        self.processor = processor

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike[str]) -> MediaProcessor:
        return cls(load_processor(directory))

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self.processor.tokenizer

    @property
    def chat_template(self) -> str | None:
        template = getattr(self.processor, "chat_template", None)
        return template if isinstance(template, str) else self.tokenizer.chat_template

    @property
    def modalities(self) -> frozenset[Modality]:
        """What the processor can take: ``images`` with an image processor, ``audio`` with a
        feature extractor."""
        found: set[Modality] = set()
        if getattr(self.processor, "image_processor", None) is not None:
            found.add("images")
        if getattr(self.processor, "feature_extractor", None) is not None:
            found.add("audio")
        return frozenset(found)

    @property
    def sampling_rate(self) -> int | None:
        extractor = getattr(self.processor, "feature_extractor", None)
        rate = getattr(extractor, "sampling_rate", None)
        return None if rate is None else int(rate)

    @property
    def max_audio_seconds(self) -> float | None:
        """The feature extractor's window (Whisper's ``n_samples`` / ``sampling_rate``: 30 s
        for Qwen2-Audio): a longer clip would be cut to it, so the data refuses one."""
        extractor = getattr(self.processor, "feature_extractor", None)
        samples = getattr(extractor, "n_samples", None)
        rate = self.sampling_rate
        if not isinstance(samples, int) or rate is None:
            return None
        return samples / rate

    def render(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """The prompt text: the processor's chat template, with the generation prompt."""
        if self.chat_template is None:
            raise ConfigError(
                "the model's processor has no chat template: media placeholders are written by "
                "the chat template, so prompts with media need one"
            )
        rendered = self.processor.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=True
        )
        if not isinstance(rendered, str):
            raise TypeError(
                f"apply_chat_template(tokenize=False) returned {type(rendered).__name__}, "
                "expected str"
            )
        return rendered

    def process(
        self, text: str, *, images: Sequence[Image] = (), audio: Sequence[AudioClip] = ()
    ) -> ProcessedMedia:
        """The expanded prompt ids and model inputs of ``text`` (rendered with its placeholders)
        and its media."""
        kwargs: dict[str, Any] = {"text": [text], "return_tensors": "pt"}
        if images:
            kwargs["images"] = [list(images)]
        if audio:
            rate = self.sampling_rate
            wrong = [clip.sampling_rate for clip in audio if clip.sampling_rate != rate]
            if wrong:
                raise ConfigError(
                    f"audio at {wrong[0]} Hz, but the model's feature extractor takes {rate} Hz: "
                    "resample it first"
                )
            kwargs["audio"] = [clip.waveform.numpy() for clip in audio]
            kwargs["sampling_rate"] = rate
        outputs = self.processor(**kwargs)
        ids = outputs["input_ids"]
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[0] != 1:
            raise TypeError(f"the processor returned input_ids {ids!r}, expected one row")
        length = int(ids.shape[1])
        per_token = _per_token(outputs, length)
        tensors = {
            name: value
            for name, value in outputs.items()
            if name not in _TEXT_OUTPUTS
            and name not in per_token
            and isinstance(value, torch.Tensor)
        }
        counts: dict[str, int] = {}
        if images:
            counts["images"] = len(images)
        if audio:
            counts["audio"] = len(audio)
        return ProcessedMedia(
            prompt_token_ids=ids[0].tolist(),
            tensors=tensors,
            token_tensors=per_token,
            counts=counts,
        )
