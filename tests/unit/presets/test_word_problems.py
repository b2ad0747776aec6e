"""The smollm2 preset's word problems: answers checked by reading each question independently."""

from __future__ import annotations

import json
import operator
import re
from collections import Counter
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import pytest

from lrft.api.errors import ConfigError
from lrft.presets.word_problems import (
    INSTRUCTION,
    TEMPLATES,
    WordProblem,
    WordProblemTask,
    problem_rows,
    write_jsonl,
)
from lrft.rewards import gsm8k_answer

# What each story asks, read from its wording rather than from the generator's own operation;
# the first cue found decides ("3 bags with 4 in each bag ... in all?" is a product).
CUES: list[tuple[str, Callable[[Fraction, Fraction], Fraction]]] = [
    ("in each", operator.mul),
    ("equally among", operator.truediv),
    ("into boxes of", operator.truediv),
    ("more", operator.add),
    ("in all?", operator.add),  # a box and a table
    ("left?", operator.sub),
    ("sold", operator.sub),
]


def solve(question: str) -> Fraction:
    """The answer computed from the text alone: its two numbers and its cue words."""
    numbers = [Fraction(n) for n in re.findall(r"\d+", question)]
    assert len(numbers) == 2, question
    for cue, apply in CUES:
        if cue in question:
            return apply(numbers[0], numbers[1])
    raise AssertionError(f"no cue in {question!r}")


TASK = WordProblemTask(num_train=400, num_eval=80, seed=3)


def all_problems() -> tuple[WordProblem, ...]:
    return TASK.train_problems() + TASK.eval_problems()


def test_every_answer_equals_the_question_solved_independently() -> None:
    for problem in all_problems():
        expected = solve(problem.question)
        assert expected.denominator == 1, problem  # quotients are exact
        assert expected > 0, problem
        assert problem.answer == expected, problem
        # the reference's #### line is what the math reward compares with
        assert gsm8k_answer(problem.reference) == str(int(expected))
        assert problem.prompt == f"{problem.question} {INSTRUCTION}"


def test_numbers_stay_in_their_ranges() -> None:
    for problem in all_problems():
        numbers = [int(n) for n in re.findall(r"\d+", problem.question)]
        if problem.operation in "+-":
            assert max(numbers) <= TASK.max_operand
        elif problem.operation == "*":
            assert max(numbers) <= TASK.max_factor
        else:  # a dividend of divisor x quotient
            assert numbers[1] <= TASK.max_factor
            assert numbers[0] // numbers[1] <= TASK.max_factor


def test_held_out_questions_never_appear_in_training() -> None:
    train = {p.question for p in TASK.train_problems()}
    held_out = [p.question for p in TASK.eval_problems()]
    assert len(train) == TASK.num_train
    assert len(set(held_out)) == len(held_out) == TASK.num_eval
    assert not train & set(held_out)


def test_every_story_is_equally_frequent_in_both_sets() -> None:
    for problems in (TASK.train_problems(), TASK.eval_problems()):
        counts = Counter(p.template for p in problems)
        assert set(counts) == set(range(len(TEMPLATES)))
        assert max(counts.values()) - min(counts.values()) <= 1


def test_the_seed_decides_the_problems() -> None:
    again = WordProblemTask(num_train=400, num_eval=80, seed=3)
    assert again.train_problems() == TASK.train_problems()
    other = WordProblemTask(num_train=400, num_eval=80, seed=4)
    assert other.eval_problems() != TASK.eval_problems()
    # a pinned problem: the draw must not change across Python versions or refactors
    first = WordProblemTask().eval_problems()[0]
    assert first.question == (
        "Sara has 9 stickers. Sara finds 8 more stickers. How many stickers does Sara have now?"
    )


def test_rows_and_file(tmp_path: Path) -> None:
    problems = TASK.eval_problems()[:3]
    path = write_jsonl(tmp_path / "sub" / "eval.jsonl", problems)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == problem_rows(problems)
    assert rows[0] == {"input": problems[0].prompt, "answer": problems[0].reference}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_operand": 2}, r"max_operand must be >= 3 .* got 2"),
        ({"max_factor": 1}, r"max_factor >= 2, got 10 and 1"),
        ({"num_train": 6000, "max_factor": 3}, r"asks 775 questions of each story, more than half"),
        ({"num_eval": 0}, r"num_eval must be > 0"),
    ],
)
def test_settings_are_validated(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        WordProblemTask(**kwargs)
