"""Suite checks, registered once.

A check is a module-level function named ``check_<what>``, decorated with its suite's registry
(``ROLLOUT_CHECKS``, ``SYNC_CHECKS``, ``TRAIN_CHECKS``). The suite class makes one pytest test,
``test_<what>``, per registered check (``CheckRegistry.add_tests``), and the suite module
serves every check by name (``CheckRegistry.lookup``, for a module-level ``__getattr__``): adding
a check is writing one decorated function, and a check and its test always share a name.

Tests run in a fixed order, whatever order the check modules are imported in: by module name,
then by line, except checks registered ``last`` (one that builds an engine of its own goes last,
so that an engine allowing one instance per process is rebuilt once), which follow the others.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import attrs

from lrft.testing.distributed import RankPool

F = TypeVar("F", bound=Callable[..., Any])

PREFIX = "check_"


@attrs.frozen(kw_only=True)
class RegisteredCheck:
    """One check of a suite. ``name`` is ``what`` of ``check_<what>`` and ``test_<what>``;
    ``fixtures`` the pytest fixtures whose values follow the suite class in the check's
    arguments; ``in_parent``: the check runs in the test process and is given the suite class
    and the pool (it runs things on ranks itself), not run on every rank."""

    name: str
    function: Callable[..., Any]
    fixtures: tuple[str, ...]
    in_parent: bool = False
    last: bool = False

    @property
    def test_name(self) -> str:
        return f"test_{self.name}"

    def order(self) -> tuple[bool, str, int]:
        code = inspect.unwrap(self.function).__code__
        return (self.last, self.function.__module__, code.co_firstlineno)


class RunsRegisteredChecks(Protocol):
    """What a suite class gives the tests ``add_tests`` makes."""

    def run_registered(self, pool: RankPool, check: RegisteredCheck, *fixtures: Any) -> None: ...


class CheckRegistry:
    """The checks of one suite; ``fixtures`` are those its checks take unless they say."""

    def __init__(self, suite: str, *, fixtures: Sequence[str] = ()) -> None:
        self.suite = suite
        self._fixtures = tuple(fixtures)
        self._checks: dict[str, RegisteredCheck] = {}

    def __call__(self, function: F, /) -> F:
        """Register ``function`` (named ``check_<what>``) with the suite's default fixtures."""
        return self.options()(function)

    def options(
        self, *, fixtures: Sequence[str] | None = None, in_parent: bool = False, last: bool = False
    ) -> Callable[[F], F]:
        """A decorator registering a check that takes other ``fixtures``, runs ``in_parent``, or
        runs ``last``."""

        def record(function: F) -> F:
            name = function.__name__
            what = name.removeprefix(PREFIX)
            if not name.startswith(PREFIX) or not what.isidentifier():
                raise ValueError(
                    f"a {self.suite} suite check must be named {PREFIX}<what> (its test is "
                    f"test_<what>), got {name!r}"
                )
            known = self._checks.get(what)
            if known is not None and inspect.unwrap(known.function) is not inspect.unwrap(function):
                raise ValueError(
                    f"two {self.suite} suite checks are named {name!r}: in "
                    f"{known.function.__module__} and in {function.__module__}"
                )
            self._checks[what] = RegisteredCheck(
                name=what,
                function=function,
                fixtures=self._fixtures if fixtures is None else tuple(fixtures),
                in_parent=in_parent,
                last=last,
            )
            return function

        return record

    def __iter__(self) -> Iterator[RegisteredCheck]:
        return iter(sorted(self._checks.values(), key=RegisteredCheck.order))

    def __len__(self) -> int:
        return len(self._checks)

    def lookup(self, name: str, renamed: Mapping[str, str] | None = None) -> Callable[..., Any]:
        """The check function called ``name`` (``check_<what>``), or one of its earlier names in
        ``renamed`` (old name -> current name); AttributeError otherwise, as a module's
        ``__getattr__`` must raise."""
        current = (renamed or {}).get(name, name)
        check = self._checks.get(current.removeprefix(PREFIX))
        if check is None or not current.startswith(PREFIX):
            raise AttributeError(f"the {self.suite} suite has no check {name!r}")
        return check.function

    def function_names(self) -> list[str]:
        return [check.function.__name__ for check in self]

    def add_tests(self, suite_class: type) -> None:
        """Give ``suite_class`` (a ``RunsRegisteredChecks``) a method ``test_<what>`` for each
        registered check, in order."""
        for check in self:
            setattr(suite_class, check.test_name, _test_method(suite_class, check))


def _test_method(suite_class: type, check: RegisteredCheck) -> Callable[..., None]:
    # pytest reads a test's fixtures from its signature: (self, pool, *the check's fixtures)
    signature = inspect.Signature(
        [
            inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            for name in ("self", "pool", *check.fixtures)
        ]
    )

    def test(*args: Any, **kwargs: Any) -> None:
        arguments = signature.bind(*args, **kwargs).arguments
        suite: RunsRegisteredChecks = arguments["self"]
        suite.run_registered(arguments["pool"], check, *(arguments[n] for n in check.fixtures))

    test.__name__ = check.test_name
    test.__qualname__ = f"{suite_class.__qualname__}.{check.test_name}"
    test.__doc__ = check.function.__doc__
    test.__signature__ = signature  # type: ignore[attr-defined]  # read by inspect.signature
    return test


#: the ``RolloutEngineSuite``'s checks: ``check(suite, models, device=None)``
ROLLOUT_CHECKS = CheckRegistry("rollout", fixtures=("engine_models",))
#: the ``WeightSyncSuite``'s checks: ``check(suite, model_dir)`` on every rank
SYNC_CHECKS = CheckRegistry("sync", fixtures=("model_dir",))
#: the ``TrainBackendSuite``'s checks: ``check(suite)`` on every rank
TRAIN_CHECKS = CheckRegistry("train")
