"""Prompt datasets: read a local source, format each prompt, tokenise it, drop what is too long.

Loading is eager: every prompt is formatted and tokenised once, up front, so the number of usable
prompts (which the sampler needs) and the number dropped are known before training starts, and a
broken row fails the run at start-up rather than hours in.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from lrft.api import validators as v
from lrft.api.errors import ConfigError
from lrft.data.audio import AudioSource
from lrft.data.errors import PromptDataError
from lrft.data.formatting import PromptFormat, check_tokenizer, format_prompt
from lrft.data.images import DEFAULT_MAX_IMAGE_PIXELS, ImageSource
from lrft.data.media import MediaLoader, media_messages
from lrft.data.media_rows import check_media_processor, row_audio, row_images
from lrft.data.processor import MediaProcessor
from lrft.data.sources import RowSource, SourceRow, read_rows
from lrft.data.types import PromptSample, PromptStats

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

_TOKENIZE_CHUNK = 1024
"""Prompts per tokenizer call: batches use the fast tokenizer's parallelism, chunks bound memory."""


_optional_positive = v.optional(v.positive_int)


def _non_empty_key(_: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"{attribute.name} must be a non-empty string, got {value!r}")


@attrs.frozen(kw_only=True)
class PromptDataConfig:
    """Where the prompts are and how to turn them into token ids (LightRFT's flag names).

    - ``prompt_data``: a local ``.jsonl``/``.json``/``.parquet`` file or ``save_to_disk`` folder;
      ``split`` picks a split of a ``DatasetDict`` folder (default ``train``);
    - ``input_key``: the column holding the prompt (a string, or a list of chat messages);
    - ``label_key`` / ``reference_key``: columns passed through to the reward (``None``: none);
    - ``apply_chat_template``, ``system_prompt``, ``input_template``: see :class:`PromptFormat`;
    - ``max_prompt_length``: prompts with more tokens are dropped and counted, never truncated
      (``None``: no limit);
    - ``add_special_tokens``: let the tokenizer add its special tokens (BOS) when encoding. Off by
      default because a chat template writes the special tokens it wants into the text, and
      adding them again would double the BOS; turn it on for plain text prompts on a tokenizer
      that expects BOS;
    - ``max_samples``: read only the first ``max_samples`` rows (``None``: all);
    - ``images_key``: the column holding each prompt's images (one or a list: paths relative to
      the data file, bytes, ``{"bytes", "path"}`` records or PIL images; see
      :mod:`lrft.data.images`); needs the model's processor and ``apply_chat_template``, whose
      template writes the image placeholders (:mod:`lrft.data.media` places them);
    - ``limit_mm_image_per_prompt``: a row with more images is an error (``None``: no limit);
    - ``max_image_pixels``: an image with more pixels is an error;
    - ``audios_key``: the column holding each prompt's audio clips (one or a list: sound-file
      paths relative to the data file, bytes or ``{"bytes", "path"}`` records; see
      :mod:`lrft.data.audio`), placed like images (``<audio>`` markers or audio parts); a clip
      longer than the feature extractor's window is an error, one at another sampling rate is
      resampled to the extractor's;
    - ``limit_mm_audio_per_prompt``: a row with more clips is an error (``None``: no limit).
    """

    prompt_data: str = attrs.field(converter=os.fspath)
    input_key: str = attrs.field(default="input", validator=_non_empty_key)
    label_key: str | None = attrs.field(default=None, validator=_non_empty_key)
    reference_key: str | None = attrs.field(default=None, validator=_non_empty_key)
    apply_chat_template: bool = False
    system_prompt: str | None = None
    input_template: str | None = None
    max_prompt_length: int | None = attrs.field(default=None, validator=_optional_positive)
    add_special_tokens: bool = False
    max_samples: int | None = attrs.field(default=None, validator=_optional_positive)
    split: str | None = None
    images_key: str | None = attrs.field(default=None, validator=_non_empty_key)
    limit_mm_image_per_prompt: int | None = attrs.field(default=None, validator=_optional_positive)
    max_image_pixels: int = attrs.field(default=DEFAULT_MAX_IMAGE_PIXELS, validator=v.positive_int)
    audios_key: str | None = attrs.field(default=None, validator=_non_empty_key)
    limit_mm_audio_per_prompt: int | None = attrs.field(default=None, validator=_optional_positive)

    @property
    def prompt_format(self) -> PromptFormat:
        # Built (and so validated) on every access: cheap, and the config stays plain data.
        return PromptFormat(
            apply_chat_template=self.apply_chat_template,
            system_prompt=self.system_prompt,
            input_template=self.input_template,
        )

    def __attrs_post_init__(self) -> None:
        _ = self.prompt_format  # validate the formatting options when the config is made
        for option, key in (("images_key", self.images_key), ("audios_key", self.audios_key)):
            if key is not None and not self.apply_chat_template:
                raise ConfigError(
                    f"{option}={key!r} needs apply_chat_template=True: the model's chat "
                    "template writes the media placeholders its processor expands"
                )
        if self.images_key is not None and self.images_key == self.audios_key:
            raise ConfigError(
                f"images_key and audios_key are both {self.images_key!r}: one column cannot "
                "hold both"
            )

    @property
    def has_media(self) -> bool:
        return self.images_key is not None or self.audios_key is not None


@attrs.frozen(kw_only=True)
class PromptDataset:
    """The usable prompts of one source, in source order, and what loading dropped.

    Index it with the indices a :class:`~lrft.data.sampler.DistributedPromptSampler` hands out
    (``dataset.select(batch.indices)``); the sampler's ``num_samples`` is ``len(dataset)``.
    """

    samples: tuple[PromptSample, ...]
    stats: PromptStats
    media: MediaLoader | None = None

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> PromptSample:
        return self.samples[index]

    def __iter__(self) -> Iterator[PromptSample]:
        return iter(self.samples)

    def select(self, indices: Sequence[int]) -> tuple[PromptSample, ...]:
        """The samples at ``indices``, those with images carrying their decoded media."""
        chosen = tuple(self.samples[i] for i in indices)
        if self.media is None:
            return chosen
        return tuple(self.media.with_media(sample) for sample in chosen)

    @cached_property
    def fingerprint(self) -> str:
        """A digest of the kept prompts' source indices and token ids.

        Store it beside the sampler position in a checkpoint: a resumed run whose data, template,
        tokenizer or length limit changed has a different fingerprint, and the saved sampler
        position would point at different prompts.
        """
        digest = hashlib.blake2b(digest_size=16)
        for sample in self.samples:
            digest.update(
                f"{sample.source_index}:{','.join(map(str, sample.prompt_token_ids))};".encode()
            )
            for image in sample.images:
                digest.update(_image_key(image))
            for clip in sample.audio:
                digest.update(_image_key(clip))
        return digest.hexdigest()


def _image_key(image: ImageSource | AudioSource) -> bytes:
    if image.data is not None:
        return hashlib.blake2b(image.data, digest_size=16).digest()
    if image.path is not None:
        return f"path:{image.path}".encode()
    assert isinstance(image, ImageSource)
    assert image.image is not None
    return hashlib.blake2b(image.image.tobytes(), digest_size=16).digest()


def load_prompt_dataset(
    config: PromptDataConfig,
    tokenizer: PreTrainedTokenizerBase,
    processor: MediaProcessor | None = None,
) -> PromptDataset:
    """Read, format, tokenise and filter the prompts of ``config.prompt_data``.

    Raises :class:`PromptDataError` for a row that lacks a configured key or holds an input of
    the wrong kind (naming the key, the source and the row, and listing the keys it has), and
    when no prompt is left. Prompts over ``max_prompt_length`` are dropped, listed in
    ``stats.dropped_too_long`` and reported with one warning.

    With ``images_key`` or ``audios_key``, ``processor`` (the model's, :class:`MediaProcessor`)
    formats and tokenises the rows with media: every image and clip is read and processed once
    here, so a missing, unreadable, oversized or too long item, or a row over a per-prompt
    limit, fails the load with a :class:`PromptDataError` naming the row, the file and the
    item. The media are decoded again when a sample is selected (:meth:`PromptDataset.select`).
    """
    prompt_format = config.prompt_format
    check_tokenizer(prompt_format, tokenizer)
    if config.has_media:
        check_media_processor(config.images_key, config.audios_key, processor)
    source = read_rows(config.prompt_data, split=config.split)
    rows = source.rows[: config.max_samples]
    if not rows:
        raise PromptDataError(f"prompt data {source.name!r} has no rows")
    # Every key of every row is checked here, dropped rows included, so a data error is found
    # whatever the length limit.
    parsed = [_parse(row, config, prompt_format, tokenizer, source, processor) for row in rows]
    texts = [entry.text for entry in parsed]
    token_ids = _tokenize(texts, tokenizer, add_special_tokens=config.add_special_tokens)
    loader = None
    if processor is not None and config.has_media:
        loader = MediaLoader(
            source=source.name, processor=processor, max_image_pixels=config.max_image_pixels
        )
        token_ids = _media_token_ids(parsed, token_ids, loader, source.name)
    dataset = _filter(config, source.name, parsed, token_ids, loader)
    if dataset.stats.dropped:
        logger.warning("%s", dataset.stats.summary())
    if not dataset.samples:
        raise PromptDataError(f"no prompt is left: {dataset.stats.summary()}")
    return dataset


def _value(row: SourceRow, key: str, option: str, where: str) -> object:
    if key not in row.values:
        raise PromptDataError(
            f"{option} {key!r} is missing in {where}; keys present: {row.describe_keys()}"
        )
    return row.values[key]


def _tokenize(
    texts: list[str], tokenizer: PreTrainedTokenizerBase, *, add_special_tokens: bool
) -> list[tuple[int, ...]]:
    token_ids: list[tuple[int, ...]] = []
    for start in range(0, len(texts), _TOKENIZE_CHUNK):
        encoded = tokenizer(
            texts[start : start + _TOKENIZE_CHUNK],
            add_special_tokens=add_special_tokens,
            return_attention_mask=False,
        )
        token_ids.extend(tuple(int(token) for token in ids) for ids in encoded["input_ids"])
    return token_ids


@attrs.frozen(kw_only=True)
class _ParsedRow:
    row: SourceRow
    text: str
    raw_input: object
    label: object
    reference: object
    images: tuple[ImageSource, ...] = ()
    audio: tuple[AudioSource, ...] = ()


def _row_media(
    row: SourceRow, config: PromptDataConfig, source: RowSource, where: str
) -> tuple[tuple[ImageSource, ...], tuple[AudioSource, ...]]:
    # media paths are relative to the data file (to a datasets folder: that folder)
    base = Path(source.name) if Path(source.name).is_dir() else Path(source.name).parent
    images: tuple[ImageSource, ...] = ()
    if config.images_key is not None:
        value = _value(row, config.images_key, "images_key", where)
        limit = config.limit_mm_image_per_prompt
        images = row_images(value, config.images_key, limit, base=base, where=where)
    audio: tuple[AudioSource, ...] = ()
    if config.audios_key is not None:
        value = _value(row, config.audios_key, "audios_key", where)
        limit = config.limit_mm_audio_per_prompt
        audio = row_audio(value, config.audios_key, limit, base=base, where=where)
    return images, audio


def _parse(
    row: SourceRow,
    config: PromptDataConfig,
    prompt_format: PromptFormat,
    tokenizer: PreTrainedTokenizerBase,
    source: RowSource,
    processor: MediaProcessor | None,
) -> _ParsedRow:
    where = f"{source.name} {row.where}"
    raw_input = value = _value(row, config.input_key, "input_key", where)
    images, audio = _row_media(row, config, source, where)
    if images or audio:
        assert processor is not None  # checked with images_key / audios_key
        messages = media_messages(value, len(images), prompt_format, where=where, audio=len(audio))
        text = processor.render(messages)
    else:
        text = format_prompt(value, prompt_format, tokenizer, where=where)
    label = None if config.label_key is None else _value(row, config.label_key, "label_key", where)
    reference = (
        None
        if config.reference_key is None
        else _value(row, config.reference_key, "reference_key", where)
    )
    return _ParsedRow(
        row=row,
        text=text,
        raw_input=raw_input,
        label=label,
        reference=reference,
        images=images,
        audio=audio,
    )


def _media_token_ids(
    parsed: Sequence[_ParsedRow],
    token_ids: list[tuple[int, ...]],
    loader: MediaLoader,
    source_name: str,
) -> list[tuple[int, ...]]:
    """The validation pass: every image and clip of every row read, and each row with media
    processed for its expanded ids (the text-only rows keep theirs)."""
    ids = list(token_ids)
    with_media = [i for i, entry in enumerate(parsed) if entry.images or entry.audio]
    for position in with_media:
        entry = parsed[position]
        where = f"{source_name} {entry.row.where}"
        images, clips = loader.read(entry.images, entry.audio, where=where)
        processed = loader.processor.process(entry.text, images=images, audio=clips)
        ids[position] = processed.prompt_token_ids
    if with_media:
        logger.info("%s: read and processed the media of %d rows", source_name, len(with_media))
    return ids


def _filter(
    config: PromptDataConfig,
    source_name: str,
    parsed: Sequence[_ParsedRow],
    token_ids: list[tuple[int, ...]],
    loader: MediaLoader | None,
) -> PromptDataset:
    samples: list[PromptSample] = []
    too_long: list[int] = []
    empty: list[int] = []
    passed_through = {
        config.input_key,
        config.label_key,
        config.reference_key,
        config.images_key,
        config.audios_key,
    }
    for entry, ids in zip(parsed, token_ids, strict=True):
        index = entry.row.index
        if not ids:
            empty.append(index)
            continue
        if config.max_prompt_length is not None and len(ids) > config.max_prompt_length:
            too_long.append(index)
            continue
        samples.append(
            PromptSample(
                prompt_text=entry.text,
                prompt_token_ids=ids,
                label=entry.label,
                reference=entry.reference,
                metadata={k: v for k, v in entry.row.values.items() if k not in passed_through},
                source_index=index,
                images=entry.images,
                audio=entry.audio,
                raw_input=entry.raw_input,
            )
        )
    stats = PromptStats(
        source=source_name,
        rows=len(parsed),
        kept=len(samples),
        max_prompt_length=config.max_prompt_length,
        dropped_too_long=too_long,
        dropped_empty=empty,
        longest_kept=max((sample.prompt_length for sample in samples), default=0),
    )
    return PromptDataset(samples=tuple(samples), stats=stats, media=loader)
