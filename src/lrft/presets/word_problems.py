"""Arithmetic word problems drawn from a seed: the task of the ``smollm2`` preset.

A problem is a two-sentence story with two numbers and one operation (``+``, ``-``, ``*`` or
an exact ``/``), asked in words: "Maya has 7 shells. Maya finds 5 more shells. How many shells
does Maya have now?". Its reference is a GSM8K-style worked line ending in ``#### 12``, so the
math reward (which reads ``\\boxed{...}`` and ``####`` answers) checks a response against it.

Training and held-out problems come from one seeded draw, held-out first, and no held-out
question appears in training word for word. The draw uses only ``random.Random(seed).random()``,
whose sequence Python guarantees across versions, so the same settings give the same problems on
every machine.
"""

from __future__ import annotations

import functools
import json
import os
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import attrs

from lrft.api import validators as v
from lrft.api.errors import ConfigError

Operation = Literal["+", "-", "*", "/"]

INPUT_KEY = "input"
REFERENCE_KEY = "answer"
INSTRUCTION = "End with the answer after ####."
"""Appended to every question. Of the answer formats the math reward reads (``\\boxed{}`` and
``####``), SmolLM2-135M-Instruct follows this request most often: asked for a boxed answer it
mostly writes none, or an empty box."""

NAMES = ("Maya", "Tom", "Lena", "Omar", "Sara", "Ben", "Nina", "Leo", "Aisha", "Paul")
ITEMS = ("apples", "shells", "stickers", "marbles", "pencils", "coins", "books", "cookies")
"""Plural nouns; ``item`` in a template is one of these."""


@attrs.frozen(kw_only=True)
class Template:
    """A story with the slots ``{name}``, ``{item}``, ``{a}`` and ``{b}`` (in that order of
    the numbers), and its operation."""

    text: str
    operation: Operation


TEMPLATES: tuple[Template, ...] = (
    Template(
        text="{name} has {a} {item}. {name} finds {b} more {item}. "
        "How many {item} does {name} have now?",
        operation="+",
    ),
    Template(
        text="{name} puts {a} {item} in a box and {b} {item} on the table. "
        "How many {item} does {name} have in all?",
        operation="+",
    ),
    Template(
        text="{name} has {a} {item} and gives {b} of them to a friend. "
        "How many {item} does {name} have left?",
        operation="-",
    ),
    Template(
        text="{name} had {a} {item} and sold {b} {item}. How many {item} does {name} have now?",
        operation="-",
    ),
    Template(
        text="{name} buys {a} bags with {b} {item} in each bag. "
        "How many {item} does {name} buy in all?",
        operation="*",
    ),
    Template(
        text="{name} lays out {a} rows of {item} with {b} {item} in each row. "
        "How many {item} are there?",
        operation="*",
    ),
    Template(
        text="{name} shares {a} {item} equally among {b} friends. "
        "How many {item} does each friend get?",
        operation="/",
    ),
    Template(
        text="{name} packs {a} {item} into boxes of {b}. How many boxes does {name} fill?",
        operation="/",
    ),
)


@attrs.frozen(kw_only=True)
class WordProblem:
    """One problem: the story's text, its two numbers in the order they appear, and the answer."""

    template: int = attrs.field(validator=v.non_negative)
    question: str
    operation: Operation
    a: int = attrs.field(validator=v.positive_number)
    b: int = attrs.field(validator=v.positive_number)
    answer: int

    @property
    def prompt(self) -> str:
        """The question and the answer-format instruction: the user message of the chat."""
        return f"{self.question} {INSTRUCTION}"

    @property
    def reference(self) -> str:
        """A GSM8K-style worked line: ``12 + 7 = 19`` then ``#### 19``."""
        return f"{self.a} {self.operation} {self.b} = {self.answer}\n#### {self.answer}"


def _operands(
    operation: Operation, draw: random.Random, max_operand: int, max_factor: int
) -> tuple[int, int]:
    def pick(low: int, high: int) -> int:
        return low + int(draw.random() * (high - low + 1))

    if operation == "+":
        return pick(1, max_operand), pick(1, max_operand)
    if operation == "-":
        a = pick(3, max_operand)
        return a, pick(1, a - 1)
    if operation == "*":
        return pick(2, max_factor), pick(2, max_factor)
    divisor, quotient = pick(2, max_factor), pick(2, max_factor)
    return divisor * quotient, divisor


def _solve(operation: Operation, a: int, b: int) -> int:
    if operation == "+":
        return a + b
    if operation == "-":
        return a - b
    if operation == "*":
        return a * b
    return a // b


@attrs.frozen(kw_only=True)
class WordProblemTask:
    """Seeded, disjoint training and held-out word problems (see the module docstring).

    Sums and differences use numbers from 1 to ``max_operand``; products and quotients use
    factors from 2 to ``max_factor`` (the defaults suit a 135 M-parameter model, which answers
    about a quarter of them greedily before training). The ``i``-th problem drawn uses template
    ``i % len(TEMPLATES)``, so every story, and so every operation, is equally frequent in both
    sets.
    """

    num_train: int = attrs.field(default=2000, validator=v.positive_number)
    num_eval: int = attrs.field(default=200, validator=v.positive_number)
    max_operand: int = attrs.field(default=10, validator=v.positive_number)
    max_factor: int = attrs.field(default=5, validator=v.positive_number)
    seed: int = 0

    def __attrs_post_init__(self) -> None:
        if self.max_operand < 3 or self.max_factor < 2:
            raise ConfigError(
                f"max_operand must be >= 3 (a difference needs 3 - 1) and max_factor >= 2, "
                f"got {self.max_operand} and {self.max_factor}"
            )
        total = self.num_train + self.num_eval
        per_template = -(-total // len(TEMPLATES))
        fewest = min(self.distinct_questions(t) for t in TEMPLATES)
        # Half the room at most, so that drawing past the repeats stays quick.
        if 2 * per_template > fewest:
            raise ConfigError(
                f"num_train + num_eval = {total} asks {per_template} questions of each story, "
                f"more than half the {fewest} distinct questions of the least varied story "
                f"with max_operand {self.max_operand} and max_factor {self.max_factor}"
            )

    def distinct_numbers(self, operation: Operation) -> int:
        """How many number pairs a story of ``operation`` can have under these settings."""
        if operation == "+":
            return self.max_operand**2
        if operation == "-":
            return sum(a - 1 for a in range(3, self.max_operand + 1))
        return (self.max_factor - 1) ** 2

    def distinct_questions(self, template: Template) -> int:
        """How many different questions ``template`` can ask (numbers, name, item)."""
        return self.distinct_numbers(template.operation) * len(NAMES) * len(ITEMS)

    def train_problems(self) -> tuple[WordProblem, ...]:
        return _draw(self)[0]

    def eval_problems(self) -> tuple[WordProblem, ...]:
        return _draw(self)[1]


@functools.cache
def _draw(task: WordProblemTask) -> tuple[tuple[WordProblem, ...], tuple[WordProblem, ...]]:
    draw = random.Random(task.seed)
    seen: set[str] = set()
    problems: list[WordProblem] = []
    while len(problems) < task.num_train + task.num_eval:
        index = len(problems) % len(TEMPLATES)
        template = TEMPLATES[index]
        a, b = _operands(template.operation, draw, task.max_operand, task.max_factor)
        name = NAMES[int(draw.random() * len(NAMES))]
        item = ITEMS[int(draw.random() * len(ITEMS))]
        question = template.text.format(name=name, item=item, a=a, b=b)
        if question in seen:
            continue  # a repeated question would put held-out problems into training
        seen.add(question)
        problems.append(
            WordProblem(
                template=index,
                question=question,
                operation=template.operation,
                a=a,
                b=b,
                answer=_solve(template.operation, a, b),
            )
        )
    return tuple(problems[task.num_eval :]), tuple(problems[: task.num_eval])


def problem_rows(problems: Iterable[WordProblem]) -> list[dict[str, str]]:
    """Prompt-file rows: the prompt under ``"input"``, the worked reference under ``"answer"``."""
    return [{INPUT_KEY: p.prompt, REFERENCE_KEY: p.reference} for p in problems]


def write_jsonl(path: str | os.PathLike[str], problems: Iterable[WordProblem]) -> Path:
    """Write ``problems`` as JSONL rows (see :func:`problem_rows`) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as file:
        for row in problem_rows(problems):
            file.write(json.dumps(row) + "\n")
    return path
