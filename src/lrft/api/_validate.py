"""attrs validators whose messages name the field, the value and the rule."""

from __future__ import annotations

import math
from typing import Any

import attrs


def positive(_: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not value > 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value!r}")


def non_negative(_: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not value >= 0:
        raise ValueError(f"{attribute.name} must be >= 0, got {value!r}")


def finite(_: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"{attribute.name} must be finite, got {value!r}")


def unit_interval_open_closed(_: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{attribute.name} must be in (0, 1], got {value!r}")


def non_negative_ints(_: Any, attribute: attrs.Attribute[Any], value: tuple[int, ...]) -> None:
    for item in value:
        if not isinstance(item, int) or isinstance(item, bool) or item < 0:
            raise ValueError(
                f"{attribute.name} must hold non-negative integers, got {item!r} in {value!r}"
            )
