"""``--config FILE``: a JSON (``.json``) or YAML file of option names and values."""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

from lrft.api.errors import ConfigError


def read_keys(path: Path, known: Collection[str]) -> dict[str, Any]:
    """The mapping in ``path``; refuses anything but a mapping, and keys not in ``known``."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        values = json.loads(text)
    else:
        import yaml  # type: ignore[import-untyped, unused-ignore]  # PyYAML is optional and untyped

        values = yaml.safe_load(text)
    if not isinstance(values, dict):
        raise ConfigError(
            f"config file {path} must hold a mapping of keys, got {type(values).__name__}"
        )
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(f"config file {path} has unknown keys {unknown}")
    return values
