"""Reward-model training data: preference pairs and judge examples, read, checked and tokenised
up front.

Rows come from the same local sources as prompts (JSONL, JSON, Parquet, a ``datasets`` folder:
:func:`lrft.data.read_rows`), and the prompt column is formatted as ``lrft train`` formats its
prompts (:class:`lrft.data.PromptFormat`: input template, then chat template), so a reward model
is trained on the text it will score:

- a preference pair is ``prompt + chosen`` against ``prompt + rejected``, each tokenised as
  :class:`~lrft.rewards.SequenceClassifierReward` tokenises ``prompt + response`` (with the
  tokenizer's special tokens), with an optional per-pair ``margin``;
- a step example (:mod:`lrft.rm.steps`) is a prompt and its response of labelled steps;
- a judge example is the judge prompt that :class:`~lrft.rewards.GenerativeReward` renders for
  ``(prompt, response, reference)`` with the same template and tokenisation, followed by the
  verdict's tokens and the end-of-sequence token; the verdict must parse under the template.

Every row is checked before training starts: a missing column or a value of the wrong kind is a
:class:`~lrft.data.PromptDataError` (a ``ConfigError``) naming the column, the source, the row
and the columns it has. Examples longer than ``max_len`` tokens are dropped and counted, never
truncated.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Generic, TypeVar

import attrs

from lrft.data import PromptDataError, PromptFormat, SourceRow, format_prompt, read_rows
from lrft.data.formatting import check_tokenizer
from lrft.rewards.generative import JudgeTokenizer, judge_prompt_ids
from lrft.rewards.judge_template import JudgeTemplate

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@attrs.frozen(kw_only=True)
class PreferencePair:
    """The token ids of ``prompt + chosen`` and ``prompt + rejected``, and the pair's margin."""

    chosen: tuple[int, ...]
    rejected: tuple[int, ...]
    margin: float = 0.0

    @property
    def length(self) -> int:
        return max(len(self.chosen), len(self.rejected))

    def digest_text(self) -> str:
        return (
            f"{','.join(map(str, self.chosen))}|{','.join(map(str, self.rejected))}|{self.margin!r}"
        )


@attrs.frozen(kw_only=True)
class JudgeExample:
    """A judge prompt followed by its verdict: ``input_ids[target_start:]`` are the targets."""

    input_ids: tuple[int, ...]
    target_start: int

    @property
    def length(self) -> int:
        return len(self.input_ids)

    def digest_text(self) -> str:
        return f"{','.join(map(str, self.input_ids))}|{self.target_start}"


@attrs.frozen(kw_only=True)
class StepExample:
    """A prompt and its response of labelled steps: ``labels[k]`` is the label of the step that
    ends at token ``positions[k]`` of ``input_ids``."""

    input_ids: tuple[int, ...]
    positions: tuple[int, ...]
    labels: tuple[float, ...]

    @property
    def length(self) -> int:
        return len(self.input_ids)

    def digest_text(self) -> str:
        ids, ends = ",".join(map(str, self.input_ids)), ",".join(map(str, self.positions))
        return f"{ids}|{ends}|{','.join(map(repr, self.labels))}"


E = TypeVar("E", PreferencePair, JudgeExample, StepExample)


@attrs.frozen(kw_only=True)
class ExampleSet(Generic[E]):
    """The usable examples of one source, in source order; ``dropped`` lists the source rows
    over the length limit."""

    source: str
    examples: tuple[E, ...]
    dropped: tuple[int, ...] = ()

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> E:
        return self.examples[index]

    @property
    def fingerprint(self) -> str:
        """A digest of every kept example's tokens: a resume checks that the data it continues
        on is the data its sampler position counts."""
        digest = hashlib.blake2b(digest_size=16)
        for example in self.examples:
            digest.update(example.digest_text().encode())
        return digest.hexdigest()

    def summary(self) -> str:
        return (
            f"{self.source}: {len(self.examples)} examples kept, {len(self.dropped)} dropped "
            "as too long"
        )


@attrs.frozen(kw_only=True)
class Columns:
    """The columns a row is read from (``lrft train-rm``'s ``*_key`` flags)."""

    prompt: str = "prompt"
    chosen: str = "chosen"
    rejected: str = "rejected"
    margin: str | None = None
    response: str = "response"
    verdict: str = "verdict"
    reference: str | None = None


def column(row: SourceRow, key: str, flag: str, where: str) -> object:
    if key not in row.values:
        raise PromptDataError(
            f"--{flag} {key!r} is missing in {where}; columns present: {row.describe_keys()}"
        )
    return row.values[key]


def _text(row: SourceRow, key: str, flag: str, where: str) -> str:
    value = column(row, key, flag, where)
    if not isinstance(value, str):
        raise PromptDataError(
            f"--{flag} {key!r} in {where} must be a string, got {type(value).__name__} "
            f"({value!r:.80})"
        )
    return value


def _margin(row: SourceRow, key: str, where: str) -> float:
    value = column(row, key, "margin_key", where)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PromptDataError(
            f"--margin_key {key!r} in {where} must be a finite number, got {value!r}"
        )
    return float(value)


def source_rows(path: str, max_samples: int | None) -> tuple[str, tuple[SourceRow, ...]]:
    source = read_rows(path)
    rows = source.rows[:max_samples]
    if not rows:
        raise PromptDataError(f"reward-model data {source.name!r} has no rows")
    return source.name, rows


def kept_examples(source: str, examples: list[tuple[int, E]], max_len: int | None) -> ExampleSet[E]:
    kept = tuple(e for _, e in examples if max_len is None or e.length <= max_len)
    dropped = tuple(i for i, e in examples if max_len is not None and e.length > max_len)
    if not kept:
        raise PromptDataError(
            f"{source}: every one of its {len(examples)} examples has more than max_len "
            f"{max_len} tokens"
        )
    return ExampleSet(source=source, examples=kept, dropped=dropped)


def load_preference_pairs(
    path: str,
    *,
    columns: Columns,
    prompt_format: PromptFormat,
    tokenizer: PreTrainedTokenizerBase,
    max_len: int | None = None,
    max_samples: int | None = None,
) -> ExampleSet[PreferencePair]:
    """The preference pairs of ``path`` (see the module docstring)."""
    check_tokenizer(prompt_format, tokenizer)
    name, rows = source_rows(path, max_samples)
    pairs: list[tuple[int, PreferencePair]] = []
    for row in rows:
        where = f"{name} {row.where}"
        prompt = format_prompt(
            column(row, columns.prompt, "prompt_key", where), prompt_format, tokenizer, where=where
        )
        chosen = _text(row, columns.chosen, "chosen_key", where)
        rejected = _text(row, columns.rejected, "rejected_key", where)
        margin = 0.0 if columns.margin is None else _margin(row, columns.margin, where)
        pair = PreferencePair(
            chosen=_ids(tokenizer, prompt + chosen, where),
            rejected=_ids(tokenizer, prompt + rejected, where),
            margin=margin,
        )
        pairs.append((row.index, pair))
    return kept_examples(name, pairs, max_len)


def _ids(tokenizer: PreTrainedTokenizerBase, text: str, where: str) -> tuple[int, ...]:
    ids = tuple(int(token) for token in tokenizer.encode(text, add_special_tokens=True))
    if not ids:
        raise PromptDataError(f"{where}: {text!r:.80} tokenises to no tokens")
    return ids


def load_judge_examples(
    path: str,
    *,
    columns: Columns,
    template: JudgeTemplate,
    prompt_format: PromptFormat,
    chat: bool,
    tokenizer: PreTrainedTokenizerBase,
    max_len: int | None = None,
    max_samples: int | None = None,
) -> ExampleSet[JudgeExample]:
    """The judge examples of ``path`` (see the module docstring). ``prompt_format`` formats the
    prompt column before it fills the template's ``{prompt}`` slot (the GRM reward fills it with
    the policy's prompt as the policy saw it); ``chat`` wraps the judge prompt in the judge's
    chat template, as the GRM reward does with ``--grm_apply_chat_template``."""
    check_tokenizer(PromptFormat(apply_chat_template=chat), tokenizer)
    eos = tokenizer.eos_token_id
    if eos is None:
        raise PromptDataError(
            "the judge's tokenizer has no end-of-sequence token to end its verdicts with"
        )
    name, rows = source_rows(path, max_samples)
    examples: list[tuple[int, JudgeExample]] = []
    judge_tokenizer: JudgeTokenizer = tokenizer
    for row in rows:
        where = f"{name} {row.where}"
        prompt = format_prompt(
            column(row, columns.prompt, "prompt_key", where), prompt_format, tokenizer, where=where
        )
        response = _text(row, columns.response, "response_key", where)
        verdict = _text(row, columns.verdict, "verdict_key", where)
        reference = (
            None
            if columns.reference is None
            else _text(row, columns.reference, "reference_key", where)
        )
        if template.parse(verdict) is None:
            raise PromptDataError(
                f"--verdict_key {columns.verdict!r} in {where} is {verdict!r:.80}, which judge "
                f"template {template.name!r} cannot parse (its verdict form is "
                f"{template.verdict!r}): the judge would learn to write unparsable verdicts"
            )
        try:
            text = template.render(prompt=prompt, response=response, reference=reference)
        except ValueError as error:
            raise PromptDataError(f"{where}: {error} (set --reference_key)") from error
        prompt_ids = judge_prompt_ids(text, judge_tokenizer, chat=chat)
        target = [*tokenizer.encode(verdict, add_special_tokens=False), int(eos)]
        example = JudgeExample(input_ids=(*prompt_ids, *target), target_start=len(prompt_ids))
        examples.append((row.index, example))
    return kept_examples(name, examples, max_len)


def longest(examples: Sequence[PreferencePair | JudgeExample | StepExample]) -> int:
    return max((example.length for example in examples), default=0)
