"""The demo task: seeded disjoint problem sets, exact answer checking, the sloppy teacher."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lrft.api.errors import ConfigError
from lrft.demos.task import (
    EOS_TEXT,
    INPUT_KEY,
    REFERENCE_KEY,
    AdditionTask,
    Problem,
    accuracy,
    extract_answer,
    is_correct,
    problem_rows,
    sloppy_sum,
    teacher_answers,
    write_jsonl,
)


def _digest(problems: tuple[Problem, ...]) -> str:
    text = ";".join(p.prompt + p.answer for p in problems)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def test_problem_prompt_and_answer() -> None:
    problem = Problem(a=47, b=38)
    assert problem.prompt == "47+38="
    assert problem.answer == "85"
    assert Problem(a=0, b=0).answer == "0"
    with pytest.raises(ConfigError, match="a must be >= 0"):
        Problem(a=-1, b=2)


def test_default_splits_are_pinned() -> None:
    # The shipped model and its recorded accuracies refer to exactly these problems: a change of
    # the draw must be deliberate (and the model rebuilt), never a side effect.
    task = AdditionTask()
    train, held_out = task.train_problems(), task.eval_problems()
    assert (len(train), len(held_out)) == (6000, 500)
    assert [p.prompt for p in held_out[:3]] == ["85+99=", "78+29=", "47+86="]
    assert [p.prompt for p in train[:3]] == ["26+84=", "20+20=", "41+10="]
    assert (_digest(train), _digest(held_out)) == ("3789ff43f03ecf71", "d13b85a8c2522f24")


def test_splits_are_deterministic_and_depend_on_the_seed() -> None:
    first, again = AdditionTask(seed=3), AdditionTask(seed=3)
    assert first.train_problems() == again.train_problems()
    assert first.eval_problems() == again.eval_problems()
    assert AdditionTask(seed=4).eval_problems() != first.eval_problems()


@pytest.mark.parametrize(
    "task", [AdditionTask(), AdditionTask(digits=1, num_train=60, num_eval=15)]
)
def test_splits_are_disjoint_even_with_swapped_operands(task: AdditionTask) -> None:
    train, held_out = task.train_problems(), task.eval_problems()
    assert (len(train), len(held_out)) == (task.num_train, task.num_eval)
    train_pairs = {(p.a, p.b) for p in train}
    held_out_pairs = {(p.a, p.b) for p in held_out}
    assert len(train_pairs) == len(train)
    assert len(held_out_pairs) == len(held_out)
    assert not train_pairs & held_out_pairs
    assert not train_pairs & {(b, a) for a, b in held_out_pairs}


def test_operands_have_the_configured_number_of_digits() -> None:
    for task in (AdditionTask(), AdditionTask(digits=3, num_train=500, num_eval=50)):
        operands = [x for p in task.train_problems() + task.eval_problems() for x in (p.a, p.b)]
        assert {len(str(x)) for x in operands} == {task.digits}
    single = AdditionTask(digits=1, num_train=10, num_eval=5)
    assert min(x for p in single.train_problems() for x in (p.a, p.b)) >= 0


def test_too_many_problems_for_the_operand_range_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"exceeds the 100 operand pairs of 1-digit operands"):
        AdditionTask(digits=1, num_train=90, num_eval=10)


@pytest.mark.parametrize(
    ("response", "stated"),
    [
        ("85", "85"),
        ("  85\n", "85"),
        (f"85{EOS_TEXT}", "85"),
        (f"85{EOS_TEXT}junk after the end", "85"),
        ("0", "0"),
        ("", None),
        ("085", None),
        ("+85", None),
        ("-85", None),
        ("8 5", None),
        ("85abc", None),
        ("the answer is 85", None),
        ("85.0", None),
        (EOS_TEXT, None),
    ],
)
def test_extract_answer(response: str, stated: str | None) -> None:
    assert extract_answer(response) == stated


def test_is_correct_and_accuracy() -> None:
    assert is_correct("85", "85")
    assert is_correct(f"85{EOS_TEXT}", "85")
    assert not is_correct("84", "85")
    assert not is_correct("085", "85")
    assert accuracy(["85", "84", "12 ", "x"], ["85", "85", "12", "1"]) == 0.5
    with pytest.raises(ValueError, match="2 responses for 1 answers"):
        accuracy(["1", "2"], ["1"])
    with pytest.raises(ValueError, match="undefined"):
        accuracy([], [])


@given(st.integers(0, 10**6))
def test_a_stated_integer_is_extracted_as_written(n: int) -> None:
    assert extract_answer(str(n)) == str(n)
    assert extract_answer(f" {n}{EOS_TEXT}") == str(n)


@given(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 2**32))
def test_a_careful_teacher_adds(a: int, b: int, seed: int) -> None:
    assert sloppy_sum(a, b, carry_drop=0.0, rng=random.Random(seed)) == str(a + b)


@given(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 2**32))
def test_a_teacher_who_always_drops_carries_adds_columns_modulo_10(
    a: int, b: int, seed: int
) -> None:
    width = max(len(str(a)), len(str(b)))
    columns = [
        (int(x) + int(y)) % 10
        for x, y in zip(str(a).zfill(width), str(b).zfill(width), strict=True)
    ]
    expected = str(int("".join(map(str, columns))))
    assert sloppy_sum(a, b, carry_drop=1.0, rng=random.Random(seed)) == expected


def test_sloppy_sum_drops_carries_at_the_given_rate() -> None:
    rng = random.Random(0)
    answers = [sloppy_sum(18, 69, carry_drop=0.7, rng=rng) for _ in range(4000)]
    assert set(answers) == {"87", "77"}
    assert answers.count("87") / len(answers) == pytest.approx(0.3, abs=0.03)
    # Without a carry there is nothing to drop.
    assert {sloppy_sum(12, 34, carry_drop=1.0, rng=rng) for _ in range(10)} == {"46"}
    with pytest.raises(ValueError, match=r"carry_drop must be in \[0, 1\]"):
        sloppy_sum(1, 2, carry_drop=1.5, rng=rng)


@pytest.mark.parametrize(
    ("a", "b", "carries", "answers"),
    [
        (12, 34, False, {"46"}),
        (0, 0, False, {"0"}),
        (15, 5, True, {"20", "10"}),
        (95, 91, True, {"186", "86"}),
        (99, 1, True, {"100", "90", "0"}),
        (50, 50, True, {"100", "0"}),
    ],
)
def test_carries_and_teacher_answers(a: int, b: int, carries: bool, answers: set[str]) -> None:
    problem = Problem(a=a, b=b)
    assert problem.has_carry is carries
    assert teacher_answers(problem) == answers


@given(st.integers(0, 999), st.integers(0, 999), st.integers(0, 2**32))
def test_the_teacher_answers_within_its_answer_set(a: int, b: int, seed: int) -> None:
    answers = teacher_answers(Problem(a=a, b=b))
    assert str(a + b) in answers
    assert sloppy_sum(a, b, carry_drop=0.5, rng=random.Random(seed)) in answers
    assert (len(answers) > 1) is Problem(a=a, b=b).has_carry


def test_prompt_files(tmp_path: Path) -> None:
    problems = AdditionTask().eval_problems()[:4]
    path = write_jsonl(tmp_path / "deep" / "eval.jsonl", problems)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == problem_rows(problems)
    assert rows[0] == {INPUT_KEY: "85+99=", REFERENCE_KEY: "184"}
