"""Final-answer extraction: hand-written responses and the answers a reader would take."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lrft.rewards import extract_answer, gsm8k_answer, last_boxed, reference_answer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is \\boxed{42}.", "42"),
        ("\\boxed{1} first, then \\boxed{ \\frac{1}{2} }", "\\frac{1}{2}"),
        ("nested \\boxed{\\frac{a}{b^{2}}} ok", "\\frac{a}{b^{2}}"),
        ("set \\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces are not grouping
        ("\\fbox{7}", "7"),
        ("\\boxed {8}", "8"),
        ("good \\boxed{3} then cut off \\boxed{\\frac{1}{", "3"),  # unclosed last box skipped
        ("empty \\boxed{} and \\boxed{  }", None),
        ("no box here: 42", None),
        ("\\boxed{5", None),
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("She has 3 + 4 = 7 apples.\n#### 7", "7"),
        ("#### 1,234,567", "1234567"),
        ("#### $1,200.", "1200"),
        ("#### 12,34", "12,34"),  # not thousands groups: left for the parser
        ("#### 3\nlater\n####   -5  \n", "-5"),
        ("#### \n", None),
        ("no marker 42", None),
    ],
)
def test_gsm8k_answer(text: str, expected: str | None) -> None:
    assert gsm8k_answer(text) == expected


def test_extract_answer_tries_formats_in_order() -> None:
    text = "#### 5\nand also \\boxed{6}"
    assert extract_answer(text) == "6"
    assert extract_answer(text, ("gsm8k", "boxed")) == "5"
    assert extract_answer("#### 5", ("boxed",)) is None


def test_reference_answer_extracts_or_keeps_a_plain_answer() -> None:
    assert reference_answer("Half of it: \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert reference_answer("2 + 2 = 4\n#### 4") == "4"
    assert reference_answer("  \\frac{1}{2} \n") == "\\frac{1}{2}"


brace_free = st.text(alphabet=st.characters(blacklist_characters="{}\\"), max_size=20)


@settings(max_examples=50, deadline=None)
@given(before=brace_free, inner=brace_free, after=brace_free)
def test_a_braced_group_inside_the_box_comes_back_whole(
    before: str, inner: str, after: str
) -> None:
    content = "\\frac{" + inner + "}{2}"
    assert last_boxed(before + "\\boxed{" + content + "}" + after) == content.strip()
