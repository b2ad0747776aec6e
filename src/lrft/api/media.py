"""Multimodal inputs: a prompt's raw media and what the model's processor made of them.

A modality is data on the request, the sample and the training sequence, never a second code
path. :class:`MediaInputs` is one prompt's media: the raw items (decoded images, audio clips)
and, once the model's own processor ran on the data side, :class:`ProcessedMedia`: the expanded
prompt token ids (each placeholder repeated as often as the model's encoder emits features for
its item) with the tensors the model's forward takes (``pixel_values`` and ``image_grid_thw`` for
Qwen2-VL, ``input_features`` and ``feature_attention_mask`` for Qwen2-Audio, ...). Engines and
trainers consume the processed tensors as they are, so a trainer's forward sees exactly what the
engine saw; an engine that processes raw media itself (vLLM) reads the raw items.

Modalities are named like the capabilities that accept them (:data:`MODALITIES`): an engine
declares ``images`` or ``audio`` in its ``EngineCapabilities``, and a request carrying a
modality the engine lacks is refused with ``CapabilityNotSupported`` before any work. A new
modality (video) is a new field with an empty default and a new capability name, so nothing
that exists changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import attrs
import torch

from lrft.api import validators as v

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

    Image: TypeAlias = PILImage | torch.Tensor
else:
    Image: TypeAlias = Any

Modality = Literal["images", "audio"]
MODALITIES: tuple[Modality, ...] = ("images", "audio")
"""Every modality lrft knows, by the capability name an engine declares for it."""


def is_pil_image(value: object) -> bool:
    """Whether ``value`` is a Pillow image (checked without importing Pillow)."""
    return any(
        cls.__module__.startswith("PIL.") and cls.__name__ == "Image" for cls in type(value).__mro__
    )


def _check_image(index: int, image: object) -> None:
    if is_pil_image(image):
        return
    if not isinstance(image, torch.Tensor):
        raise TypeError(
            f"image {index} must be a PIL image or a uint8 tensor (channels, height, width), "
            f"got {type(image).__name__}"
        )
    if image.dtype != torch.uint8 or image.dim() != 3 or image.shape[0] not in (1, 3, 4):
        raise ValueError(
            f"image {index} as a tensor must be uint8 of shape (channels, height, width) with 1, 3 "
            f"or 4 channels, got {image.dtype} of shape {tuple(image.shape)}"
        )


def _images(values: Any) -> tuple[Image, ...]:
    images = tuple(values)
    for index, image in enumerate(images):
        _check_image(index, image)
    return images


@attrs.frozen(kw_only=True, eq=False)
class AudioClip:
    """One mono waveform, float samples in [-1, 1], at ``sampling_rate`` samples per second."""

    waveform: torch.Tensor
    sampling_rate: int = attrs.field(validator=v.positive_int)

    def __attrs_post_init__(self) -> None:
        if self.waveform.dim() != 1 or not self.waveform.is_floating_point():
            raise ValueError(
                f"an audio waveform must be a 1-D floating-point tensor (mono samples), got "
                f"{self.waveform.dtype} of shape {tuple(self.waveform.shape)}"
            )
        if self.waveform.numel() == 0:
            raise ValueError("an audio waveform must hold at least one sample")

    @property
    def seconds(self) -> float:
        return self.waveform.numel() / self.sampling_rate


def _audio(values: Any) -> tuple[AudioClip, ...]:
    clips = tuple(values)
    for index, clip in enumerate(clips):
        if not isinstance(clip, AudioClip):
            raise TypeError(f"audio item {index} must be an AudioClip, got {type(clip).__name__}")
    return clips


def _tensors(values: Mapping[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
    for name, tensor in values.items():
        if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
            raise TypeError(f"processed media must map names to tensors, got {name!r}: {tensor!r}")
    return MappingProxyType(dict(values))


@attrs.frozen(kw_only=True, eq=False)
class ProcessedMedia:
    """What the model's processor made of one prompt with its media.

    ``prompt_token_ids``: the prompt with every placeholder expanded (the ids the model reads).
    ``tensors``: the model's media inputs, each with the prompt's media items (or their patches)
    along dimension 0, so that a batch of prompts is every prompt's tensor concatenated along
    dimension 0 (``pixel_values`` (patches, features), ``image_grid_thw`` (images, 3),
    ``input_features`` (clips, mels, frames), ...). ``token_tensors``: inputs with one value per
    prompt token (``mm_token_type_ids``), laid out like the prompt wherever it sits in a batch.
    ``counts``: how many items of each modality the prompt holds.
    """

    prompt_token_ids: tuple[int, ...] = attrs.field(
        converter=v.int_tuple, validator=v.non_negative_ints
    )
    tensors: Mapping[str, torch.Tensor] = attrs.field(converter=_tensors)
    token_tensors: Mapping[str, torch.Tensor] = attrs.field(
        factory=lambda: MappingProxyType({}), converter=_tensors
    )
    counts: Mapping[str, int] = attrs.field(
        factory=lambda: MappingProxyType({}), converter=v.read_only
    )

    def __attrs_post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError("processed media need a non-empty prompt")
        for name, tensor in self.token_tensors.items():
            if tuple(tensor.shape) != (len(self.prompt_token_ids),):
                raise ValueError(
                    f"token tensor {name!r} has shape {tuple(tensor.shape)}; it needs one value "
                    f"per prompt token ({len(self.prompt_token_ids)},)"
                )
        for modality, count in self.counts.items():
            if modality not in MODALITIES or not isinstance(count, int) or count < 0:
                raise ValueError(
                    f"counts must map modalities {MODALITIES} to item counts >= 0, got "
                    f"{modality!r}: {count!r}"
                )

    def __reduce__(self) -> tuple[Any, ...]:
        # A mappingproxy does not pickle, and a TP group's ranks gather their requests by
        # pickling them (``lrft.dist.tp_group_generate``): rebuilt from plain dicts.
        fields = (self.prompt_token_ids, dict(self.tensors), dict(self.token_tensors))
        return (_processed_media, (*fields, dict(self.counts)))

    def continued(self, tokens: Sequence[int]) -> ProcessedMedia:
        """The same media after a prompt extended by text ``tokens`` (a continuation request:
        a prompt and the first tokens of its response); per-token tensors get zeros (text)."""
        extra = len(tokens)
        return ProcessedMedia(
            prompt_token_ids=(*self.prompt_token_ids, *tokens),
            tensors=self.tensors,
            token_tensors={
                name: torch.cat([values, values.new_zeros(extra)])
                for name, values in self.token_tensors.items()
            },
            counts=self.counts,
        )


def _processed_media(
    prompt_token_ids: tuple[int, ...],
    tensors: dict[str, torch.Tensor],
    token_tensors: dict[str, torch.Tensor],
    counts: dict[str, int],
) -> ProcessedMedia:
    return ProcessedMedia(
        prompt_token_ids=prompt_token_ids,
        tensors=tensors,
        token_tensors=token_tensors,
        counts=counts,
    )


@attrs.frozen(kw_only=True, eq=False)
class MediaInputs:
    """One prompt's media: raw ``images`` (PIL images or uint8 ``(C, H, W)`` tensors) and
    ``audio`` clips, and ``processed`` once the model's processor ran.

    ``modalities`` are the capabilities an engine needs to take them. The counts of
    ``processed`` must equal the raw items' where both are given.
    """

    images: tuple[Image, ...] = attrs.field(default=(), converter=_images)
    audio: tuple[AudioClip, ...] = attrs.field(default=(), converter=_audio)
    processed: ProcessedMedia | None = None

    def __attrs_post_init__(self) -> None:
        raw = self.raw_counts()
        if self.processed is None:
            if not any(raw.values()):
                raise ValueError("MediaInputs need at least one image or audio clip")
            return
        for modality, count in self.processed.counts.items():
            if raw[modality] and raw[modality] != count:
                raise ValueError(
                    f"the processed media count {count} {modality}, the raw media "
                    f"{raw[modality]}: they must describe the same items"
                )

    def raw_counts(self) -> dict[str, int]:
        return {"images": len(self.images), "audio": len(self.audio)}

    def count(self, modality: Modality) -> int:
        """Items of ``modality``, raw or (when only processed are given) processed."""
        raw = self.raw_counts()[modality]
        if raw or self.processed is None:
            return raw
        return int(self.processed.counts.get(modality, 0))

    def continued(self, tokens: Sequence[int]) -> MediaInputs:
        """These media after the prompt extended by text ``tokens`` (see
        :meth:`ProcessedMedia.continued`)."""
        processed = None if self.processed is None else self.processed.continued(tokens)
        return MediaInputs(images=self.images, audio=self.audio, processed=processed)

    @property
    def modalities(self) -> frozenset[Modality]:
        """The modalities with at least one item: the capabilities an engine needs."""
        return frozenset(modality for modality in MODALITIES if self.count(modality))
