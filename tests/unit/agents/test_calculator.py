"""The calculator against Python's own arithmetic on ints and on ``fractions.Fraction``."""

from __future__ import annotations

import decimal
import re
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lrft.agents.tools import Calculator, CalculatorError, evaluate, format_number
from lrft.api import Tool

_OPERATORS = ["+", "-", "*", "/", "//", "%"]


@st.composite
def expressions(draw: st.DrawFn, *, depth: int = 3, decimals: bool = True) -> tuple[str, str]:
    """An expression and the same expression with every literal wrapped in ``Fraction('...')``
    (Python's exact rational arithmetic: the reference)."""
    if depth == 0 or draw(st.booleans()):
        if decimals and draw(st.booleans()):
            whole = draw(st.integers(0, 10**6))
            part = draw(st.integers(0, 999))
            literal = f"{whole}.{part:03d}"
        else:
            literal = str(draw(st.integers(0, 10**9)))
        return literal, f"Fraction('{literal}')"
    kind = draw(st.sampled_from(["binary", "unary", "power"]))
    if kind == "unary":
        sign = draw(st.sampled_from(["-", "+"]))
        text, reference = draw(expressions(depth=depth - 1, decimals=decimals))
        return f"{sign}({text})", f"{sign}({reference})"
    left, left_reference = draw(expressions(depth=depth - 1, decimals=decimals))
    if kind == "power":
        exponent = draw(st.integers(-3, 4))
        return f"({left}) ** {exponent}", f"({left_reference}) ** {exponent}"
    operator = draw(st.sampled_from(_OPERATORS))
    right, right_reference = draw(expressions(depth=depth - 1, decimals=decimals))
    reference = f"({left_reference}) {operator} ({right_reference})"
    # Fraction // Fraction is an int, and an int to a negative power a float: keep it exact
    return f"({left}) {operator} ({right})", f"Fraction({reference})"


def _reference(expression: str) -> Fraction | None:
    try:
        # Test-only: the string is generated above, never model output.
        value = eval(expression, {"Fraction": Fraction})
    except ZeroDivisionError:
        return None
    assert isinstance(value, Fraction), f"{expression} gave {value!r}"
    return Fraction(value)


@settings(max_examples=300, deadline=None)
@given(expressions())
def test_results_equal_python_fractions(pair: tuple[str, str]) -> None:
    expression, reference_expression = pair
    expected = _reference(reference_expression)
    if expected is None:
        with pytest.raises(CalculatorError, match="division by zero"):
            evaluate(expression)
    elif max(expected.numerator.bit_length(), expected.denominator.bit_length()) <= 1024:
        assert evaluate(expression) == expected, expression


@settings(max_examples=200, deadline=None)
@given(expressions(decimals=False))
def test_integer_arithmetic_equals_python_ints(pair: tuple[str, str]) -> None:
    expression, _ = pair
    if "/ " in expression or "** -" in expression:
        return  # true division and negative powers give floats in Python; fractions here
    try:
        expected = eval(expression)  # test-only: a generated integer expression
    except ZeroDivisionError:
        with pytest.raises(CalculatorError, match="division by zero"):
            evaluate(expression)
        return
    assert evaluate(expression) == expected


@pytest.mark.parametrize(
    ("expression", "shown"),
    [
        ("12345 * 6789", "83810205"),
        ("0.1 + 0.2", "0.3"),
        ("7 / 4", "1.75"),
        ("-1 / 8", "-0.125"),
        ("1 / 3", "1/3 ~ 0.333333333333"),
        ("2 ** 100", str(2**100)),
        ("2 ** -2", "0.25"),
        ("7 // -2", "-4"),
        ("-7 % 3", "2"),
        ("1e3 + 0.5", "1000.5"),
        ("0.1000000000000000001 * 10", "1.000000000000000001"),
    ],
)
def test_results_as_the_model_reads_them(expression: str, shown: str) -> None:
    result = Calculator().run(expression)
    assert result.status == "ok"
    assert result.output == shown


@given(st.fractions(max_denominator=10**6))
def test_a_shown_decimal_is_the_exact_value(value: Fraction) -> None:
    shown = format_number(value)
    if "/" in shown:
        fraction, _, approximate = shown.partition(" ~ ")
        assert Fraction(fraction) == value
        with decimal.localcontext(prec=12):
            assert (
                decimal.Decimal(approximate) == decimal.Decimal(value.numerator) / value.denominator
            )
    else:
        assert Fraction(shown) == value


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("__import__('os').system('true')", "not arithmetic"),
        ("(1).__class__", "not arithmetic"),
        ("abs(-1)", "not arithmetic"),
        ("x + 1", "not arithmetic"),
        ("[1, 2]", "not arithmetic"),
        ("'a' * 3", "not a number"),
        ("True + 1", "not a number"),
        ("1j * 2", "not a number"),
        ("2 ^ 3", r"write powers as \*\*"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("2 ** 0.5", "whole-number exponents"),
        ("9 ** 9 ** 9", "exponents are limited"),
        ("10 ** 999 * 10 ** 999 * 10 ** 999", "bits"),
        ("1" + "+1" * 120, "more than 100 parts"),
        ("1 +", "not an arithmetic expression"),
        ("(" * 5000 + "1" + ")" * 5000, ""),
    ],
)
def test_anything_else_is_refused_with_a_reason(expression: str, reason: str) -> None:
    result = Calculator().run(expression)
    assert result.status == "invalid_input"
    assert result.output.startswith("error: ")
    if reason:
        assert re.search(reason, result.output), result.output


def test_the_calculator_is_a_tool() -> None:
    assert isinstance(Calculator(), Tool)
