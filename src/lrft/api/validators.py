"""attrs validators shared across lrft: a bad value raises ``ConfigError`` (a ``ValueError``)
naming the field, the value and the rule."""

from __future__ import annotations

import math
from typing import Any

import attrs

from lrft.api.errors import ConfigError


def finite(_: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not math.isfinite(value):
        raise ConfigError(f"{attribute.name} must be finite, got {value!r}")


def positive(_: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not value > 0:
        raise ConfigError(f"{attribute.name} must be > 0, got {value!r}")


def non_negative(_: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not value >= 0:
        raise ConfigError(f"{attribute.name} must be >= 0, got {value!r}")


def unit_interval(_: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{attribute.name} must be in [0, 1], got {value!r}")


def open_unit_interval(_: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not 0.0 < value < 1.0:
        raise ConfigError(f"{attribute.name} must be in (0, 1), got {value!r}")


def optional(*validators: Any) -> Any:
    """Run ``validators`` only when the value is not ``None``."""

    def check(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is not None:
            for validator in validators:
                validator(instance, attribute, value)

    return check


def one_of(*choices: str) -> Any:
    def check(_: Any, attribute: attrs.Attribute[Any], value: str) -> None:
        if value not in choices:
            known = ", ".join(repr(c) for c in choices)
            raise ConfigError(f"{attribute.name} must be one of {known}, got {value!r}")

    return check


def positive_int(_: Any, attribute: attrs.Attribute[Any], value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{attribute.name} must be a positive integer, got {value!r}")


def unit_interval_open_closed(_: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not 0.0 < value <= 1.0:
        raise ConfigError(f"{attribute.name} must be in (0, 1], got {value!r}")


def non_negative_ints(_: Any, attribute: attrs.Attribute[Any], value: tuple[int, ...]) -> None:
    for item in value:
        if not isinstance(item, int) or isinstance(item, bool) or item < 0:
            raise ConfigError(
                f"{attribute.name} must hold non-negative integers, got {item!r} in {value!r}"
            )
