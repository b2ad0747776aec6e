"""The attrs validators and converters every lrft record uses: one rule per name.

A validator raises ``ConfigError`` (a ``ValueError``) naming the field, the value and the rule.
The numeric rules refuse booleans and non-numbers themselves: a config file can hold any JSON
value, and ``True > 0`` would otherwise pass. Integers are Python ``int`` (not ``bool``); numbers
are any real number (``int``, ``float``, NumPy scalars).

Rules of one setting alone (an engine's name, a schedule's name) live next to that setting
(:mod:`lrft.config.validators`); a rule here is one that several records share.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

import attrs

from lrft.api.errors import ConfigError


def is_number(value: object) -> bool:
    """A real number that is not a ``bool``."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_int(value: object) -> bool:
    """A Python ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


# numbers --------------------------------------------------------------------------------------


def finite(_: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if not is_number(value):
        raise ConfigError(f"{attribute.name} must be a finite number, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(f"{attribute.name} must be finite, got {value!r}")


def positive_number(_: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if not is_number(value) or not value > 0:
        raise ConfigError(f"{attribute.name} must be > 0, got {value!r}")


def non_negative(_: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if not is_number(value) or not value >= 0:
        raise ConfigError(f"{attribute.name} must be >= 0, got {value!r}")


def _interval(low: float, high: float, *, closed_low: bool, closed_high: bool) -> Any:
    text = f"{'[' if closed_low else '('}{low:g}, {high:g}{']' if closed_high else ')'}"

    def check(_: object, attribute: attrs.Attribute[Any], value: float) -> None:
        inside = is_number(value) and (
            (low <= value if closed_low else low < value)
            and (value <= high if closed_high else value < high)
        )
        if not inside:
            raise ConfigError(f"{attribute.name} must be in {text}, got {value!r}")

    return check


unit_interval = _interval(0.0, 1.0, closed_low=True, closed_high=True)
"""In [0, 1]."""
open_unit_interval = _interval(0.0, 1.0, closed_low=False, closed_high=False)
"""In (0, 1)."""
unit_interval_open_closed = _interval(0.0, 1.0, closed_low=False, closed_high=True)
"""In (0, 1]: a share that cannot be empty."""
unit_interval_closed_open = _interval(0.0, 1.0, closed_low=True, closed_high=False)
"""In [0, 1): a probability that cannot be certain (a dropout)."""


# integers -------------------------------------------------------------------------------------


def positive_int(_: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if not is_int(value) or value < 1:
        raise ConfigError(f"{attribute.name} must be a positive integer, got {value!r}")


def non_negative_int(_: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if not is_int(value) or value < 0:
        raise ConfigError(f"{attribute.name} must be an integer >= 0, got {value!r}")


def non_negative_ints(_: object, attribute: attrs.Attribute[Any], value: tuple[int, ...]) -> None:
    for item in value:
        if not is_int(item) or item < 0:
            raise ConfigError(
                f"{attribute.name} must hold non-negative integers, got {item!r} in {value!r}"
            )


# combinators ----------------------------------------------------------------------------------


def optional(*validators: Any) -> Any:
    """Run ``validators`` only when the value is not ``None``."""

    def check(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is not None:
            for validator in validators:
                validator(instance, attribute, value)

    return check


def one_of(*choices: str) -> Any:
    def check(_: object, attribute: attrs.Attribute[Any], value: str) -> None:
        if value not in choices:
            known = ", ".join(repr(c) for c in choices)
            raise ConfigError(f"{attribute.name} must be one of {known}, got {value!r}")

    return check


# converters -----------------------------------------------------------------------------------


def int_tuple(values: Iterable[Any]) -> tuple[int, ...]:
    """Token ids and other integer sequences as a tuple of ``int`` (from lists, tensors' items)."""
    return tuple(int(x) for x in values)


def read_only(values: Mapping[str, Any]) -> Mapping[str, Any]:
    """A read-only copy, so a frozen record cannot be changed through a mapping it holds."""
    return MappingProxyType(dict(values))
