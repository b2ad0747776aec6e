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
from typing import TYPE_CHECKING, Any

import attrs

from lrft.api.errors import ConfigError
from lrft.data.errors import PromptDataError
from lrft.data.formatting import PromptFormat, check_tokenizer, format_prompt
from lrft.data.sources import RowSource, SourceRow, read_rows
from lrft.data.types import PromptSample, PromptStats

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

_TOKENIZE_CHUNK = 1024
"""Prompts per tokenizer call: batches use the fast tokenizer's parallelism, chunks bound memory."""


def _optional_positive(_: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ConfigError(f"{attribute.name} must be a positive integer or None, got {value!r}")


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
    - ``max_samples``: read only the first ``max_samples`` rows (``None``: all).
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


@attrs.frozen(kw_only=True)
class PromptDataset:
    """The usable prompts of one source, in source order, and what loading dropped.

    Index it with the indices a :class:`~lrft.data.sampler.DistributedPromptSampler` hands out
    (``dataset.select(batch.indices)``); the sampler's ``num_samples`` is ``len(dataset)``.
    """

    samples: tuple[PromptSample, ...]
    stats: PromptStats

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> PromptSample:
        return self.samples[index]

    def __iter__(self) -> Iterator[PromptSample]:
        return iter(self.samples)

    def select(self, indices: Sequence[int]) -> tuple[PromptSample, ...]:
        return tuple(self.samples[i] for i in indices)

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
        return digest.hexdigest()


def load_prompt_dataset(
    config: PromptDataConfig, tokenizer: PreTrainedTokenizerBase
) -> PromptDataset:
    """Read, format, tokenise and filter the prompts of ``config.prompt_data``.

    Raises :class:`PromptDataError` for a row that lacks a configured key or holds an input of
    the wrong kind (naming the key, the source and the row, and listing the keys it has), and
    when no prompt is left. Prompts over ``max_prompt_length`` are dropped, listed in
    ``stats.dropped_too_long`` and reported with one warning.
    """
    prompt_format = config.prompt_format
    check_tokenizer(prompt_format, tokenizer)
    source = read_rows(config.prompt_data, split=config.split)
    rows = source.rows[: config.max_samples]
    if not rows:
        raise PromptDataError(f"prompt data {source.name!r} has no rows")
    # Every key of every row is checked here, dropped rows included, so a data error is found
    # whatever the length limit.
    parsed = [_parse(row, config, prompt_format, tokenizer, source) for row in rows]
    texts = [entry.text for entry in parsed]
    token_ids = _tokenize(texts, tokenizer, add_special_tokens=config.add_special_tokens)
    dataset = _filter(config, source.name, parsed, token_ids)
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


def _parse(
    row: SourceRow,
    config: PromptDataConfig,
    prompt_format: PromptFormat,
    tokenizer: PreTrainedTokenizerBase,
    source: RowSource,
) -> _ParsedRow:
    where = f"{source.name} {row.where}"
    raw_input = _value(row, config.input_key, "input_key", where)
    text = format_prompt(raw_input, prompt_format, tokenizer, where=where)
    label = None if config.label_key is None else _value(row, config.label_key, "label_key", where)
    reference = (
        None
        if config.reference_key is None
        else _value(row, config.reference_key, "reference_key", where)
    )
    return _ParsedRow(row=row, text=text, raw_input=raw_input, label=label, reference=reference)


def _filter(
    config: PromptDataConfig,
    source_name: str,
    parsed: Sequence[_ParsedRow],
    token_ids: list[tuple[int, ...]],
) -> PromptDataset:
    samples: list[PromptSample] = []
    too_long: list[int] = []
    empty: list[int] = []
    passed_through = {config.input_key, config.label_key, config.reference_key}
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
    return PromptDataset(samples=tuple(samples), stats=stats)
