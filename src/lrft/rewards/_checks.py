"""attrs validators shared by the rewards; messages name the field, the value and the rule."""

from __future__ import annotations

from typing import Any

import attrs


def name_validator(_: Any, attribute: attrs.Attribute[Any], value: str) -> None:
    # Names become metric keys ("math/extracted") and appear in errors: keep them readable.
    if not isinstance(value, str) or not value or value != value.strip() or "/" in value:
        raise ValueError(
            f"{attribute.name} must be a non-empty string without surrounding spaces or '/', "
            f"got {value!r}"
        )
