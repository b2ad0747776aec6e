"""Tools an environment lets the model call: text in, text out, failures as results.

A tool is called with the text of the model's call (the code of a Python call, the expression of
a calculator call) and returns what the model reads next. A tool never lets a failure escape as
an exception: a program that crashes, hangs, floods its output or runs out of memory is a
:class:`ToolResult` whose ``status`` says so and whose ``output`` tells the model, so that one
bad call ends neither the episode's caller nor the training run.
"""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

import attrs

from lrft.api import validators as v

ToolStatus = Literal[
    "ok",
    "error",
    "invalid_input",
    "wall_time_limit",
    "cpu_time_limit",
    "memory_limit",
    "output_limit",
    "process_limit",
    "sandbox_error",
]
"""How a tool call ended.

- ``ok``: it ran and finished normally; ``error``: it ran and failed (an exception, a non-zero
  exit status);
- ``invalid_input``: it was refused before running (not a valid expression, code too long);
- ``wall_time_limit`` / ``cpu_time_limit`` / ``memory_limit`` / ``output_limit`` /
  ``process_limit``: a limit of the tool stopped or refused it;
- ``sandbox_error``: the tool could not run the call at all (its sandbox failed to start): not
  the model's fault, and worth a look at the logs.
"""


@attrs.frozen(kw_only=True)
class ToolResult:
    """What one tool call produced: ``output`` is the text the model reads next."""

    output: str
    status: ToolStatus = "ok"
    seconds: float = attrs.field(default=0.0, validator=v.non_negative)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@runtime_checkable
class Tool(Protocol):
    """A named tool: ``run(arguments)`` with the text of the model's call.

    ``run`` never raises for anything the model wrote, and returns within the tool's own
    deadline: a tool that can hang or run away (code execution) enforces its limits itself, in a
    process it can kill. It is thread-safe: a driver steps several episodes at once, and their
    calls to one tool may overlap. ``description`` is a line the environment can show the model.
    """

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    def run(self, arguments: str) -> ToolResult: ...
