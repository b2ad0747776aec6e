"""attrs validators shared by the rewards; messages name the field, the value and the rule."""

from __future__ import annotations

import math
from typing import Any

import attrs


def name_validator(_: Any, attribute: attrs.Attribute[Any], value: str) -> None:
    # Names become metric keys ("math/extracted") and appear in errors: keep them readable.
    if not isinstance(value, str) or not value or value != value.strip() or "/" in value:
        raise ValueError(
            f"{attribute.name} must be a non-empty string without surrounding spaces or '/', "
            f"got {value!r}"
        )


def finite(_: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"{attribute.name} must be finite, got {value!r}")


def positive(_: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not value > 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value!r}")


def non_negative(_: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not value >= 0:
        raise ValueError(f"{attribute.name} must be >= 0, got {value!r}")
