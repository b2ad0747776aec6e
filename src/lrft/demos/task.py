"""The demo task: add two numbers, checked exactly by a rule.

A problem is the prompt ``"47+38="`` and its answer ``"85"`` (by default both operands have two
digits). The held-out and training problems are drawn from one seeded generator, held-out first;
a training problem is never a held-out problem nor one with the operands swapped (``38+47=``), so
held-out accuracy measures addition rather than recall.

:func:`sloppy_sum` is the teacher of the demo model's warm-up, who forgets carries, and
:func:`teacher_answers` lists what that teacher can say to a problem.
"""

from __future__ import annotations

import functools
import json
import os
import random
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from lrft.api import validators as v
from lrft.api.errors import ConfigError

if TYPE_CHECKING:
    from lrft.config import TrainConfig

EOS_TEXT = "<|endoftext|>"
"""The demo tokenizer's end-of-sequence token, as text (a decoded response may still hold it)."""

_INTEGER = re.compile(r"0|[1-9][0-9]*")


@attrs.frozen(kw_only=True)
class Problem:
    """``a + b``; the prompt is ``"{a}+{b}="`` and the answer the decimal sum, without padding."""

    a: int = attrs.field(validator=v.non_negative)
    b: int = attrs.field(validator=v.non_negative)

    @property
    def prompt(self) -> str:
        return f"{self.a}+{self.b}="

    @property
    def answer(self) -> str:
        return str(self.a + self.b)

    @property
    def has_carry(self) -> bool:
        """Whether column addition carries anywhere (the demo model's teacher may drop it)."""
        a, b, carry = self.a, self.b, 0
        while a or b:
            carry = (a % 10 + b % 10 + carry) // 10
            if carry:
                return True
            a, b = a // 10, b // 10
        return False


@attrs.frozen(kw_only=True)
class AdditionTask:
    """Seeded, disjoint training and held-out problem sets of two ``digits``-digit operands.

    The same settings give the same problems, in the same order, on every machine and Python
    version: the draw uses only ``random.Random(seed).random()``, the one method whose sequence
    Python guarantees not to change.
    """

    digits: int = attrs.field(default=2, validator=v.positive_number)
    num_train: int = attrs.field(default=6000, validator=v.positive_number)
    num_eval: int = attrs.field(default=500, validator=v.positive_number)
    seed: int = 0

    def __attrs_post_init__(self) -> None:
        pairs = self.num_operands**2
        # Each held-out problem can exclude itself and its swapped twin from training.
        if self.num_train + 2 * self.num_eval > pairs:
            raise ConfigError(
                f"num_train + 2 * num_eval ({self.num_train} + 2 * {self.num_eval}) exceeds the "
                f"{pairs} operand pairs of {self.digits}-digit operands"
            )

    @property
    def min_operand(self) -> int:
        # int(): mypy types int ** int as Any (a negative exponent would give a float).
        return int(10 ** (self.digits - 1)) if self.digits > 1 else 0

    @property
    def num_operands(self) -> int:
        return int(10**self.digits) - self.min_operand

    def train_problems(self) -> tuple[Problem, ...]:
        return _split(self)[0]

    def eval_problems(self) -> tuple[Problem, ...]:
        return _split(self)[1]


@functools.cache
def _split(task: AdditionTask) -> tuple[tuple[Problem, ...], tuple[Problem, ...]]:
    side, low = task.num_operands, task.min_operand
    draw = _distinct_codes(task.seed, side * side, task.num_train + 2 * task.num_eval)
    pairs = [(low + code // side, low + code % side) for code in draw]
    held_out = pairs[: task.num_eval]
    excluded = set(held_out) | {(b, a) for a, b in held_out}
    train: list[tuple[int, int]] = []
    for pair in pairs[task.num_eval :]:
        if pair not in excluded:
            train.append(pair)
            if len(train) == task.num_train:
                break
    return (
        tuple(Problem(a=a, b=b) for a, b in train),
        tuple(Problem(a=a, b=b) for a, b in held_out),
    )


def sloppy_sum(a: int, b: int, *, carry_drop: float, rng: random.Random) -> str:
    """``a + b`` by column addition, losing each carry with probability ``carry_drop``.

    The warm-up demonstrations of the demo model: a teacher who often forgets to carry. With
    ``carry_drop`` 0 this is the true sum; with 1, each column's digit sum modulo 10 (and no
    leading 1 from a final carry). A problem without carries is always answered correctly.
    """
    if not 0.0 <= carry_drop <= 1.0:
        raise ValueError(f"carry_drop must be in [0, 1], got {carry_drop!r}")
    return _column_sum(a, b, lambda _column: rng.random() < carry_drop)


def teacher_answers(problem: Problem) -> frozenset[str]:
    """Every answer :func:`sloppy_sum` can give: the sum with any subset of its carries lost."""
    columns = max(len(str(problem.a)), len(str(problem.b)))
    return frozenset(
        _column_sum(problem.a, problem.b, _drops_in(mask)) for mask in range(2**columns)
    )


def _drops_in(mask: int) -> Callable[[int], bool]:
    """Lose the carry out of column ``i`` (0 = ones) when bit ``i`` of ``mask`` is set."""
    return lambda column: bool(mask >> column & 1)


def _column_sum(a: int, b: int, drop: Callable[[int], bool]) -> str:
    """Column addition from the right; ``drop(column)`` is asked at each carry whether to lose it."""
    if a < 0 or b < 0:
        raise ValueError(f"operands must be non-negative, got {a!r} and {b!r}")
    digits: list[int] = []
    carry = 0
    column = 0
    while a or b or carry:
        total = a % 10 + b % 10 + carry
        a, b = a // 10, b // 10
        carry = total // 10
        if carry and drop(column):
            carry = 0
        digits.append(total % 10)
        column += 1
    return "".join(str(d) for d in reversed(digits)).lstrip("0") or "0"


def _distinct_codes(seed: int, population: int, count: int) -> list[int]:
    """``count`` distinct integers in ``[0, population)``, drawn in a seeded order."""
    rng = random.Random(seed)
    seen: set[int] = set()
    codes: list[int] = []
    while len(codes) < count:
        code = int(rng.random() * population)
        if code not in seen:
            seen.add(code)
            codes.append(code)
    return codes


def extract_answer(response: str) -> str | None:
    """The integer a response states, or ``None`` when it is malformed.

    The response may end with the end-of-sequence token's text (decoding without skipping special
    tokens) and surrounding whitespace; what remains must be a decimal integer without sign or
    leading zeros — nothing before or after it.
    """
    text = response.split(EOS_TEXT, 1)[0].strip()
    return text if _INTEGER.fullmatch(text) else None


def is_correct(response: str, answer: str) -> bool:
    """Whether ``response`` states exactly ``answer`` (see :func:`extract_answer`)."""
    return extract_answer(response) == answer


def accuracy(responses: Sequence[str], answers: Sequence[str]) -> float:
    """The fraction of responses that state their answer exactly."""
    if len(responses) != len(answers):
        raise ValueError(f"{len(responses)} responses for {len(answers)} answers")
    if not responses:
        raise ValueError("accuracy of no responses is undefined")
    return sum(is_correct(r, a) for r, a in zip(responses, answers, strict=True)) / len(responses)


INPUT_KEY = "input"
REFERENCE_KEY = "answer"


def problem_rows(problems: Iterable[Problem]) -> list[dict[str, str]]:
    """Rows for a prompt file: the prompt under ``"input"``, the answer under ``"answer"``."""
    return [{INPUT_KEY: p.prompt, REFERENCE_KEY: p.answer} for p in problems]


def write_jsonl(path: str | os.PathLike[str], problems: Iterable[Problem]) -> Path:
    """Write ``problems`` as JSONL rows (see :func:`problem_rows`) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as file:
        for row in problem_rows(problems):
            file.write(json.dumps(row) + "\n")
    return path


def write_task_files(
    directory: str | os.PathLike[str], task: AdditionTask, *, rank: int
) -> tuple[Path, Path]:
    """``task``'s training and held-out problems as ``train.jsonl`` and ``eval.jsonl`` in
    ``directory``; each rank writes its own copy and renames it into place (the same bytes
    whichever rank is first, so ranks need not wait on each other)."""
    train = Path(directory) / "train.jsonl"
    held_out = Path(directory) / "eval.jsonl"
    for path, problems in ((train, task.train_problems()), (held_out, task.eval_problems())):
        temporary = write_jsonl(path.with_name(f".{path.name}.rank{rank}"), problems)
        os.replace(temporary, path)
    return train, held_out


def with_task_files(
    config: TrainConfig,
    *,
    model: Path,
    task: AdditionTask,
    data_dir: Path,
    reward: str,
    rank: int,
) -> TrainConfig:
    """``config`` training ``model`` on ``task``'s prompt files (written into ``data_dir`` by
    :func:`write_task_files`), scored by ``reward``: what an addition demo fills in."""
    train, held_out = write_task_files(data_dir, task, rank=rank)
    return attrs.evolve(
        config,
        pretrain=str(model),
        prompt_data=str(train),
        eval_dataset=str(held_out),
        input_key=INPUT_KEY,
        reference_key=REFERENCE_KEY,
        reward_fn=reward,
    )
