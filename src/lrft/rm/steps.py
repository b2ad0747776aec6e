"""Step-labelled rows for process reward models (``lrft train-rm --step_separator TEXT``).

A row holds a prompt, its response's steps and one label per step::

    {"prompt": "12+35+8=", "steps": ["12+35=47", "47+8=55"], "labels": [1, 1]}

The response is the steps joined by the separator (``"47+8=55"`` is the last step: no
separator after it). The prompt is formatted as ``lrft train`` formats its prompts and
tokenised alone, the response likewise, so the model is trained on the token ids it will score:
a prompt's ids followed by a response's. Each step's label (1: correct, 0: wrong; a number in
[0, 1] is a soft label) is learnt at the token where the step ends, found exactly as
``lrft train --prm_step_separator`` finds it (:func:`lrft.rewards.process.step_ends`). A step
that holds the separator itself, or an empty one, would end elsewhere than the row says: such a
row is refused, naming it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs

from lrft.data import PromptDataError, PromptFormat, format_prompt
from lrft.data.formatting import check_tokenizer
from lrft.rewards.process import step_ends
from lrft.rm.data import ExampleSet, StepExample, column, kept_examples, source_rows

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@attrs.frozen(kw_only=True)
class StepColumns:
    """The columns a step-labelled row is read from (``--prompt_key``, ``--steps_key``,
    ``--step_labels_key``)."""

    prompt: str = "prompt"
    steps: str = "steps"
    labels: str = "labels"


def _steps(value: object, key: str, where: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise PromptDataError(
            f"--steps_key {key!r} in {where} must be a non-empty list of strings, got {value!r:.80}"
        )
    return [str(v) for v in value]


def _labels(value: object, key: str, where: str, count: int) -> tuple[float, ...]:
    # bools are ints: true and false are the labels 1 and 0
    numbers = isinstance(value, list) and all(isinstance(v, int | float) for v in value)
    if not numbers or not isinstance(value, list) or len(value) != count:
        raise PromptDataError(
            f"--step_labels_key {key!r} in {where} must be a list of {count} labels (one per "
            f"step, each 0 or 1 or in between), got {value!r:.80}"
        )
    labels = tuple(float(v) for v in value)
    if not all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in labels):
        raise PromptDataError(
            f"--step_labels_key {key!r} in {where}: labels lie in [0, 1], got {value!r:.80}"
        )
    return labels


def load_step_examples(
    path: str,
    *,
    separator: str,
    columns: StepColumns,
    prompt_format: PromptFormat,
    tokenizer: PreTrainedTokenizerBase,
    max_len: int | None = None,
    max_samples: int | None = None,
) -> ExampleSet[StepExample]:
    """The step-labelled examples of ``path`` (see the module docstring)."""
    check_tokenizer(prompt_format, tokenizer)
    specials = frozenset(int(i) for i in tokenizer.all_special_ids)

    def decode(ids: Sequence[int]) -> str:
        return str(tokenizer.decode(list(ids), skip_special_tokens=False))

    name, rows = source_rows(path, max_samples)
    examples: list[tuple[int, StepExample]] = []
    for row in rows:
        where = f"{name} {row.where}"
        prompt = format_prompt(
            column(row, columns.prompt, "prompt_key", where), prompt_format, tokenizer, where=where
        )
        steps = _steps(column(row, columns.steps, "steps_key", where), columns.steps, where)
        labels = _labels(
            column(row, columns.labels, "step_labels_key", where), columns.labels, where, len(steps)
        )
        prompt_ids = [int(i) for i in tokenizer.encode(prompt, add_special_tokens=False)]
        response_ids = [
            int(i) for i in tokenizer.encode(separator.join(steps), add_special_tokens=False)
        ]
        ends = step_ends(response_ids, separator, decode, specials)
        if len(ends) != len(steps):
            raise PromptDataError(
                f"{where}: its {len(steps)} steps joined by {separator!r} read as {len(ends)} "
                "steps (a step holds the separator, or is empty)"
            )
        example = StepExample(
            input_ids=(*prompt_ids, *response_ids),
            positions=tuple(len(prompt_ids) + end for end in ends),
            labels=labels,
        )
        examples.append((row.index, example))
    return kept_examples(name, examples, max_len)
