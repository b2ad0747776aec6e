"""Assertions for rank-side checks that say what was done and what was found.

pytest rewrites ``assert`` statements only in test modules; in a rank worker a bare ``assert``
fails with ``AssertionError`` and nothing else, and ``pytest.raises`` says only "DID NOT RAISE".
Every check in :mod:`lrft.testing.conformance` therefore states the values it compared, and
expects errors through :func:`raises`, which names the call that should have raised.
"""

from __future__ import annotations

import re
from types import TracebackType
from typing import Generic, TypeVar

E = TypeVar("E", bound=BaseException)

__all__ = ["Raised", "raises"]


class Raised(Generic[E]):
    """What :func:`raises` caught: ``value`` is the exception, once the block has raised it."""

    def __init__(self) -> None:
        self._value: E | None = None

    @property
    def value(self) -> E:
        if self._value is None:
            raise RuntimeError("Raised.value read before the expected exception was raised")
        return self._value


class raises(Generic[E]):  # lower case: used like pytest.raises
    """Expect the block to raise ``expected`` (whose message matches the regular expression
    ``match``, if given); ``doing`` says what the block does, for the failure message::

        with raises(WeightLoadError, "load_weights() of an unknown name") as raised:
            engine.load_weights(batch, version=2)
        raised.value  # the exception

    Another exception passes through with a note naming what was expected of ``doing``.
    """

    def __init__(
        self, expected: type[E] | tuple[type[E], ...], doing: str, *, match: str | None = None
    ) -> None:
        self._expected, self._doing, self._match = expected, doing, match
        self._caught: Raised[E] = Raised()

    def __enter__(self) -> Raised[E]:
        return self._caught

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        expected = self._expected
        names = (
            expected.__name__
            if isinstance(expected, type)
            else " or ".join(cls.__name__ for cls in expected)
        )
        if error is None:
            raise AssertionError(f"{self._doing} did not raise {names}")
        if not isinstance(error, expected):
            error.add_note(f"(while expecting {names} from: {self._doing})")
            return False
        if self._match is not None and re.search(self._match, str(error)) is None:
            raise AssertionError(
                f"{self._doing} raised {type(error).__name__}({str(error)!r}), as expected, but "
                f"its message does not match {self._match!r}"
            ) from error
        self._caught._value = error
        return True
