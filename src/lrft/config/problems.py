"""Every problem of a configuration in one error.

A command line with several faults should be fixed in one round, not one fault per attempt:
each rule (a field's validator, a check across fields, a probe of an optional package, of a
model folder or of a data file) is run whatever the others found, and what they find is raised
together as one :class:`~lrft.api.errors.ConfigError` listing each problem.

:class:`Problems` gathers them. :func:`gathering` makes one the active gatherer of a block:
inside it, :class:`lrft.config.TrainConfig`'s field validators and cross-field checks report to
it instead of raising, so that ``lrft train`` can go on to the checks that read this machine
and report both kinds at once. Outside it, a ``TrainConfig`` raises as soon as a field is
invalid, and raises every problem of its cross-field checks together.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any

import attrs

from lrft.api.errors import ConfigError

CONSEQUENCES = (
    TypeError,
    ValueError,
    AttributeError,
    LookupError,
    OSError,
    AssertionError,
    ZeroDivisionError,
)
"""What a rule may raise, other than ``ConfigError``, when an earlier problem left a value it
reads invalid (a missing folder's tokenizer, a negative size): not a problem of its own."""

_ACTIVE: ContextVar[Problems | None] = ContextVar("lrft_config_problems", default=None)


class Problems:
    """The problems of one configuration, in the order found, each once."""

    def __init__(self) -> None:
        self._found: list[str] = []
        self._invalid_fields: set[str] = set()

    @property
    def found(self) -> tuple[str, ...]:
        return tuple(self._found)

    def add(self, error: ConfigError) -> None:
        """Record each problem of ``error`` not recorded yet, but those that name a field
        already found invalid: a rule across fields that read an invalid value (a negative
        batch size that divides nothing) repeats that problem in other words."""
        for problem in error.problems:
            if problem not in self._found and not self._names_invalid_field(problem):
                self._found.append(problem)

    def add_invalid_field(self, name: str, error: ConfigError) -> None:
        """Record the problem of the field ``name``'s own validator."""
        self.add(error)
        self._invalid_fields.add(name)

    def _names_invalid_field(self, problem: str) -> bool:
        return any(re.search(rf"\b{name}\b", problem) for name in self._invalid_fields)

    def check(self, rule: Callable[..., object], *args: Any, **kwargs: Any) -> bool:
        """Run ``rule(*args, **kwargs)``; record its ``ConfigError``. True when it passed.

        Once a problem is recorded, a later rule that fails otherwise (see
        :data:`CONSEQUENCES`) is taken to read what that problem broke and is skipped; with
        none recorded, its error is a fault of its own and propagates."""
        try:
            rule(*args, **kwargs)
        except ConfigError as error:
            self.add(error)
            return False
        except CONSEQUENCES:
            if not self._found:
                raise
            return False
        return True

    def check_each(self, rules: Sequence[Callable[..., object]], *args: Any) -> None:
        """:meth:`check` each of ``rules`` with the same arguments."""
        for rule in rules:
            self.check(rule, *args)

    def raise_any(self) -> None:
        """Raise one ``ConfigError`` with every problem found, if any was."""
        if self._found:
            raise ConfigError(*self._found)


def active() -> Problems | None:
    """The gatherer of the enclosing :func:`gathering` block, if any."""
    return _ACTIVE.get()


@contextlib.contextmanager
def gathering() -> Iterator[Problems]:
    """A block whose configurations report their problems to the yielded :class:`Problems`
    instead of raising them; the caller raises them (:meth:`Problems.raise_any`)."""
    problems = Problems()
    token = _ACTIVE.set(problems)
    try:
        yield problems
    finally:
        _ACTIVE.reset(token)


@contextlib.contextmanager
def reporting() -> Iterator[Problems]:
    """The problems of a block of checks: reported to the active gatherer if there is one,
    else raised together when the block ends."""
    gatherer = _ACTIVE.get()
    problems = gatherer if gatherer is not None else Problems()
    yield problems
    if gatherer is None:
        problems.raise_any()


@attrs.frozen
class _GatheredValidator:
    """A field validator that reports to the active gatherer, if any, instead of raising."""

    validator: Callable[[Any, attrs.Attribute[Any], Any], object]

    def __call__(self, instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        problems = _ACTIVE.get()
        if problems is None:
            self.validator(instance, attribute, value)
            return
        try:
            self.validator(instance, attribute, value)
        except ConfigError as error:
            problems.add_invalid_field(attribute.name, error)
        except (TypeError, ValueError) as error:
            # attrs' own validators (instance_of, in_) raise these; the value is left out of the
            # message, as it may hold a credential
            problems.add_invalid_field(attribute.name, ConfigError(f"{attribute.name}: {error}"))


def gathered_validators(
    cls: type, fields: list[attrs.Attribute[Any]]
) -> list[attrs.Attribute[Any]]:
    """An ``attrs`` ``field_transformer``: each field's validator reports to the active
    gatherer (see :func:`gathering`)."""
    del cls
    return [
        field
        if field.validator is None
        else field.evolve(validator=_GatheredValidator(field.validator))
        for field in fields
    ]
