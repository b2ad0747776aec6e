"""Final-answer extraction from model responses and references: ``\\boxed{...}`` and GSM8K's
``#### 42``.

Extraction is plain string work, done before any parsing, so that what counts as "the answer" is
explicit and testable: the last well-formed ``\\boxed{...}`` (the convention of MATH-style
prompts) or the last ``#### ...`` line (GSM8K's). math-verify only ever sees the extracted text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

AnswerFormat = Literal["boxed", "gsm8k"]
ANSWER_FORMATS: tuple[AnswerFormat, ...] = ("boxed", "gsm8k")

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_GSM8K = re.compile(r"####[ \t]*([^\n]*)")
# GSM8K writes thousands with commas ("#### 1,234"); a comma between digit groups is not a list.
_THOUSANDS_COMMA = re.compile(r"(?<=\d),(?=\d{3}(?:\D|$))")


def _braced_content(text: str, start: int) -> str | None:
    """The text inside the group whose ``{`` is at ``start - 1``, or None if it never closes."""
    depth = 1
    index = start
    while index < len(text):
        char = text[index]
        if char == "\\":
            index += 2  # \{ and \} are literal braces in LaTeX, not grouping
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[start:index]
        index += 1
    return None


def last_boxed(text: str) -> str | None:
    """The content of the last well-formed ``\\boxed{...}`` (or ``\\fbox{...}``), stripped.

    An unclosed last box (a response cut at the length limit) is skipped in favour of the one
    before it. Empty boxes do not count as answers.
    """
    for match in reversed(list(_BOXED.finditer(text))):
        content = _braced_content(text, match.end())
        if content is not None and content.strip():
            return content.strip()
    return None


def gsm8k_answer(text: str) -> str | None:
    """The answer after the last ``####``: the rest of that line, without ``$``, thousands
    separators or a final period."""
    for match in reversed(list(_GSM8K.finditer(text))):
        answer = match.group(1).replace("$", "").strip().rstrip(".").strip()
        answer = _THOUSANDS_COMMA.sub("", answer)
        if answer:
            return answer
    return None


def extract_answer(text: str, formats: Sequence[AnswerFormat] = ANSWER_FORMATS) -> str | None:
    """The answer in ``text`` in the first of ``formats`` that finds one, or None."""
    for answer_format in formats:
        answer = last_boxed(text) if answer_format == "boxed" else gsm8k_answer(text)
        if answer is not None:
            return answer
    return None


def reference_answer(reference: str, formats: Sequence[AnswerFormat] = ANSWER_FORMATS) -> str:
    """The gold answer of a reference: extracted when the reference is a worked solution
    (MATH's boxed solutions, GSM8K's ``####`` lines), else the whole reference, stripped (a
    plain answer such as ``\\frac{1}{2}``)."""
    answer = extract_answer(reference, formats)
    return answer if answer is not None else reference.strip()
