"""Tools and environments by name: built-ins, third-party entry points, explicit registrations.

A tool is registered as a factory called with keyword options (``make_tool("python",
wall_time_s=5)``); an environment as a factory called with an :class:`EnvironmentSetup` (the
tokenizer, the tools, the options) that returns a fresh environment, one per episode. A factory
is given as a callable or as a dotted path (``"package.module:factory"``), imported on first
use. Third-party packages register under the entry-point groups ``lrft.tools`` and
``lrft.environments`` (``name = "package.module:factory"``), or call :func:`register_tool` /
:func:`register_environment`::

    from lrft.agents import EnvironmentSetup, register_environment, register_tool

    @register_tool("word_count")
    def word_count_tool() -> WordCount:  # WordCount: a class with name, description and run
        return WordCount()

    register_environment("my_game", "my_package.game:make_game")  # imported when first made

A second registration of a name with another factory raises ``ConfigError``; an unknown name
raises ``ConfigError`` listing the known ones.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

import attrs

from lrft.api import validators as v
from lrft.api.episodes import Environment
from lrft.api.errors import ConfigError
from lrft.api.tools import Tool

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def _tools(values: Iterable[Tool]) -> tuple[Tool, ...]:
    return tuple(values)


@attrs.frozen(kw_only=True)
class EnvironmentSetup:
    """What an environment factory gets: the tokenizer, the tools, and its own options."""

    tokenizer: PreTrainedTokenizerBase
    tools: tuple[Tool, ...] = attrs.field(default=(), converter=_tools)
    options: Mapping[str, Any] = attrs.field(factory=dict, converter=v.read_only, hash=False)


ToolFactory = Callable[..., Tool]
EnvironmentFactory = Callable[[EnvironmentSetup], Environment]

_F = TypeVar("_F", bound=Callable[..., Any])


class FactoryRegistry(Generic[_F]):
    """Name -> factory (or ``module:attribute`` path), with entry points under ``group``."""

    def __init__(self, kind: str, group: str) -> None:
        self.kind = kind
        self.group = group
        self._targets: dict[str, _F | str] = {}

    def register(self, name: str, target: _F | str) -> None:
        if not name or any(ch.isspace() for ch in name):
            raise ConfigError(f"{self.kind} name must be non-empty without spaces, got {name!r}")
        if isinstance(target, str):
            module, _, attribute = target.partition(":")
            if not module or not attribute:
                raise ConfigError(f"{self.kind} target {target!r} must look like 'module:name'")
        known = self._targets.get(name)
        if known is not None and known != target:
            raise ConfigError(f"{self.kind} {name!r} is already registered as {known!r}")
        self._targets[name] = target

    def remove(self, name: str) -> None:
        """Forget a registration made here (entry points stay): for tests and re-registration."""
        if name not in self._targets:
            raise ConfigError(f"no {self.kind} {name!r} was registered here")
        del self._targets[name]

    def _known(self) -> dict[str, _F | str]:
        found = importlib.metadata.entry_points(group=self.group)
        known: dict[str, _F | str] = {point.name: point.value for point in found}
        known.update(self._targets)
        return known

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._known()))

    def load(self, name: str) -> _F:
        known = self._known()
        if name not in known:
            raise ConfigError(
                f"unknown {self.kind} {name!r}; known: {', '.join(sorted(known)) or 'none'}"
            )
        target = known[name]
        if not isinstance(target, str):
            return target
        module_name, _, attribute = target.partition(":")
        module = importlib.import_module(module_name)
        try:
            factory: _F = getattr(module, attribute)
        except AttributeError:
            raise ConfigError(
                f"{self.kind} {name!r}: module {module_name!r} has no attribute {attribute!r}"
            ) from None
        return factory


tools: FactoryRegistry[ToolFactory] = FactoryRegistry("tool", "lrft.tools")
environments: FactoryRegistry[EnvironmentFactory] = FactoryRegistry(
    "environment", "lrft.environments"
)


@overload
def register_tool(name: str) -> Callable[[ToolFactory], ToolFactory]: ...
@overload
def register_tool(name: str, target: ToolFactory | str) -> None: ...
def register_tool(
    name: str, target: ToolFactory | str | None = None
) -> Callable[[ToolFactory], ToolFactory] | None:
    """Register a tool factory under ``name``: call form with ``target``, decorator without."""
    if target is not None:
        tools.register(name, target)
        return None

    def add(factory: ToolFactory) -> ToolFactory:
        tools.register(name, factory)
        return factory

    return add


@overload
def register_environment(name: str) -> Callable[[EnvironmentFactory], EnvironmentFactory]: ...
@overload
def register_environment(name: str, target: EnvironmentFactory | str) -> None: ...
def register_environment(
    name: str, target: EnvironmentFactory | str | None = None
) -> Callable[[EnvironmentFactory], EnvironmentFactory] | None:
    """Register an environment factory under ``name``: call form with ``target``, decorator
    without."""
    if target is not None:
        environments.register(name, target)
        return None

    def add(factory: EnvironmentFactory) -> EnvironmentFactory:
        environments.register(name, factory)
        return factory

    return add


def make_tool(name: str, **options: Any) -> Tool:
    """The tool ``name``, made with ``options``; checked against the ``Tool`` protocol."""
    tool = tools.load(name)(**options)
    if not isinstance(tool, Tool):
        raise ConfigError(f"the factory of tool {name!r} made {type(tool).__name__}, not a Tool")
    return tool


def make_environment(name: str, setup: EnvironmentSetup) -> Environment:
    """A fresh environment ``name`` for one episode; checked against the protocol."""
    environment = environments.load(name)(setup)
    if not isinstance(environment, Environment):
        raise ConfigError(
            f"the factory of environment {name!r} made {type(environment).__name__}, "
            "not an Environment"
        )
    return environment


register_tool("calculator", "lrft.agents.builtins:calculator_tool")
register_tool("python", "lrft.agents.builtins:python_tool")
register_environment("tool_calls", "lrft.agents.builtins:tool_calls_environment")
