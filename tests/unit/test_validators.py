"""The shared validators and converters (:mod:`lrft.api.validators`): one rule per name, the
config's module reusing them under the same names, numbers that refuse booleans and strings."""

from __future__ import annotations

import math
from typing import Any

import attrs
import pytest

from lrft.api import validators as v
from lrft.api.errors import ConfigError
from lrft.config import validators as config_validators


@attrs.frozen(kw_only=True)
class Record:
    number: Any = attrs.field(default=1.0, validator=[v.finite, v.positive_number])
    count: Any = attrs.field(default=1, validator=v.positive_int)
    share: Any = attrs.field(default=0.5, validator=v.unit_interval_open_closed)
    dropout: Any = attrs.field(default=0.0, validator=v.unit_interval_closed_open)
    ids: tuple[int, ...] = attrs.field(default=(), converter=v.int_tuple)


def test_a_name_in_both_modules_is_the_same_rule() -> None:
    shared = {name for name in set(vars(v)) & set(vars(config_validators)) if name[0] != "_"}
    for name in shared:
        assert getattr(config_validators, name) is getattr(v, name), name
    # one name per rule: the config spells no shared rule under a name of its own
    rules = {id(value) for name, value in vars(v).items() if callable(value) and name[0] != "_"}
    aliases = [
        name
        for name, value in vars(config_validators).items()
        if name not in shared and callable(value) and id(value) in rules
    ]
    assert aliases == []


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("number", True, r"number must be a finite number, got True"),
        ("number", "3", r"number must be a finite number, got '3'"),
        ("number", math.inf, r"number must be finite, got inf"),
        ("number", 0, r"number must be > 0, got 0"),
        ("count", 2.0, r"count must be a positive integer, got 2.0"),
        ("count", True, r"count must be a positive integer, got True"),
        ("share", 0.0, r"share must be in \(0, 1\], got 0.0"),
        ("dropout", 1.0, r"dropout must be in \[0, 1\), got 1.0"),
        ("dropout", False, r"dropout must be in \[0, 1\), got False"),
    ],
)
def test_a_bad_value_is_refused_naming_field_value_and_rule(
    field: str, value: Any, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        Record(**{field: value})


def test_edges_of_the_intervals_are_where_their_brackets_say() -> None:
    Record(share=1.0, dropout=0.0, number=1e-12)


def test_the_converters_copy_into_plain_values() -> None:
    assert Record(ids=[True, 2.0, "3"]).ids == (1, 2, 3)
    source = {"a": 1}
    held = v.read_only(source)
    source["a"] = 2
    assert held == {"a": 1}
    with pytest.raises(TypeError):
        held["a"] = 3  # type: ignore[index]  # read-only on purpose
