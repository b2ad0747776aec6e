"""A calculator: exact rational arithmetic on a parsed expression, never ``eval``.

The expression is parsed with Python's own grammar (:func:`ast.parse` in ``eval`` mode) and
walked node by node; only numbers, parentheses, unary ``+``/``-`` and the binary operators ``+ -
* / // % **`` are accepted, with Python's meaning, computed exactly in :class:`fractions.Fraction`
(``1/3 + 1/6`` is ``1/2``; decimals such as ``0.1`` are read as the exact decimal ``1/10``, not
as binary floats). Limits keep every call fast: the expression's length, its number of
operations, an exponent's size and every intermediate value's size. ``^`` is rejected rather than
read as exclusive or.

Results are written as integers, as exact decimals when the denominator allows (``2.5``), or as
a fraction with a rounded decimal (``1/3 ~ 0.333333333333``).
"""

from __future__ import annotations

import ast
import decimal
import operator
import time
from collections.abc import Callable
from fractions import Fraction

import attrs

from lrft.api.tools import ToolResult

MAX_EXPRESSION_CHARS = 500
MAX_OPERATIONS = 100
MAX_EXPONENT = 1000
MAX_BITS = 4096
"""The largest numerator or denominator, in bits, of any value along the way (~1233 digits)."""
DECIMAL_DIGITS = 12
MAX_DECIMAL_PLACES = 20

_BINARY: dict[type[ast.operator], Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


class CalculatorError(ValueError):
    """The expression is not one the calculator takes; the message tells the model why."""


def _number(node: ast.Constant, source: str) -> Fraction:
    value = node.value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CalculatorError(f"{value!r} is not a number")
    if isinstance(value, int):
        return _checked(Fraction(value))
    # The literal as written, read exactly: 0.1 is 1/10, not the nearest binary float.
    written = ast.get_source_segment(source, node)
    if written is None:
        raise CalculatorError(f"cannot read the number {value!r}")
    digits, _, exponent = written.replace("_", "").lower().partition("e")
    if exponent and abs(int(exponent)) > MAX_EXPONENT:
        raise CalculatorError(f"exponents are limited to ±{MAX_EXPONENT}")
    return _checked(Fraction(digits) * Fraction(10) ** int(exponent or 0))


def _checked(value: Fraction) -> Fraction:
    if max(value.numerator.bit_length(), value.denominator.bit_length()) > MAX_BITS:
        raise CalculatorError(f"a value grew past {MAX_BITS} bits")
    return value


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator != 1:
        raise CalculatorError("only whole-number exponents are supported")
    if abs(exponent) > MAX_EXPONENT:
        raise CalculatorError(f"exponents are limited to ±{MAX_EXPONENT}")
    bits = max(abs(base.numerator), base.denominator).bit_length()
    if bits * abs(int(exponent)) > MAX_BITS:
        raise CalculatorError(f"the power would grow past {MAX_BITS} bits")
    if base == 0 and exponent < 0:
        raise CalculatorError("division by zero")
    return base ** int(exponent)


_DIVISIONS = (ast.Div, ast.FloorDiv, ast.Mod)


class _Evaluator:
    def __init__(self, source: str) -> None:
        self.source = source
        self.operations = 0

    def __call__(self, node: ast.AST) -> Fraction:
        self.operations += 1
        if self.operations > MAX_OPERATIONS:
            raise CalculatorError(f"the expression has more than {MAX_OPERATIONS} parts")
        if isinstance(node, ast.Constant):
            return _number(node, self.source)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
            value = self(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp):
            left, right = self(node.left), self(node.right)
            if isinstance(node.op, ast.Pow):
                return _checked(_power(left, right))
            function = _BINARY.get(type(node.op))
            if function is None:
                symbol = "^" if isinstance(node.op, ast.BitXor) else type(node.op).__name__
                hint = " (write powers as **)" if symbol == "^" else ""
                raise CalculatorError(f"the operator {symbol} is not supported{hint}")
            if right == 0 and isinstance(node.op, _DIVISIONS):
                raise CalculatorError("division by zero")
            # Fraction // Fraction is an int in Python; keep every value a Fraction.
            return _checked(Fraction(function(left, right)))
        raise CalculatorError(f"{type(node).__name__} is not arithmetic")


def evaluate(expression: str) -> Fraction:
    """The exact value of ``expression``; raises :class:`CalculatorError` saying why not."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    source = expression.strip()
    try:
        tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError) as error:
        raise CalculatorError(f"not an arithmetic expression ({error.args[0]})") from None
    except RecursionError:
        raise CalculatorError("the expression is nested too deeply") from None
    try:
        return _Evaluator(source)(tree.body)
    except RecursionError:
        raise CalculatorError("the expression is nested too deeply") from None


def format_number(value: Fraction) -> str:
    """An integer, an exact decimal of at most ``MAX_DECIMAL_PLACES`` places, or ``p/q ~ d``
    with ``d`` rounded to ``DECIMAL_DIGITS`` significant digits."""
    if value.denominator == 1:
        return str(value.numerator)
    denominator, places = value.denominator, 0
    for prime in (2, 5):
        count = 0
        while denominator % prime == 0:
            denominator //= prime
            count += 1
        places = max(places, count)
    if denominator == 1 and places <= MAX_DECIMAL_PLACES:
        scaled = str(abs(value.numerator) * 10**places // value.denominator).rjust(places + 1, "0")
        sign = "-" if value < 0 else ""
        return f"{sign}{scaled[:-places]}.{scaled[-places:]}"
    with decimal.localcontext(prec=DECIMAL_DIGITS):
        approximate = decimal.Decimal(value.numerator) / decimal.Decimal(value.denominator)
    return f"{value.numerator}/{value.denominator} ~ {approximate}"


@attrs.frozen(kw_only=True)
class Calculator:
    """The calculator as a :class:`~lrft.api.tools.Tool` (thread-safe: it holds no state)."""

    name: str = "calculator"
    description: str = (
        "Exact arithmetic: + - * / // % ** and parentheses on integers and decimals, e.g. "
        "12345*6789 or (2**64 - 1) / 3."
    )

    def run(self, arguments: str) -> ToolResult:
        start = time.monotonic()
        try:
            value = evaluate(arguments)
        except CalculatorError as error:
            return ToolResult(
                output=f"error: {error}", status="invalid_input", seconds=time.monotonic() - start
            )
        return ToolResult(output=format_number(value), seconds=time.monotonic() - start)
