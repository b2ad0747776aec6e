"""The Python tool: the model's code runs in a :class:`~lrft.agents.sandbox.Sandbox`.

The model reads what the program printed (stdout, then stderr), followed by a line in brackets
when the program did not end normally: ``[exit status 1]``, ``[killed: the wall-time limit of
10 s was reached]``, ``[the memory limit of 512 MiB was reached]``...
"""

from __future__ import annotations

import logging
import time

from lrft.agents.sandbox import Isolation, Sandbox, SandboxLimits, SandboxResult
from lrft.api.tools import ToolResult

logger = logging.getLogger(__name__)


def observation(result: SandboxResult) -> str:
    """What the model reads of one run."""
    parts = [part for part in (result.stdout, result.stderr) if part]
    text = "".join(part if part.endswith("\n") else part + "\n" for part in parts)
    if result.status != "ok":
        text += f"[{result.detail}]"
    return text.rstrip("\n") if text.strip() else "[no output]"


class PythonTool:
    """Runs the model's Python code in a sandbox (see :mod:`lrft.agents.sandbox`); thread-safe.

    ``limits`` and ``isolation`` configure the sandbox; ``sandbox`` passes a ready one instead.
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        isolation: Isolation = "auto",
        name: str = "python",
        sandbox: Sandbox | None = None,
    ) -> None:
        self.sandbox = sandbox if sandbox is not None else Sandbox(limits, isolation=isolation)
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    @property
    def description(self) -> str:
        limits = self.sandbox.limits
        return (
            "Runs a Python program (standard library, no network) and shows what it prints; "
            f"at most {limits.wall_time_s:g} s and {limits.memory_bytes >> 20} MiB."
        )

    def run(self, arguments: str) -> ToolResult:
        start = time.monotonic()
        try:
            result = self.sandbox.run(arguments)
        except Exception as error:  # the caller's episode must go on whatever the sandbox hit
            logger.exception("the python tool's sandbox failed")
            return ToolResult(
                output=f"[the sandbox failed: {type(error).__name__}: {error}]",
                status="sandbox_error",
                seconds=time.monotonic() - start,
            )
        if result.status == "sandbox_error":
            logger.warning("the python tool's sandbox failed: %s", result.detail)
        return ToolResult(output=observation(result), status=result.status, seconds=result.seconds)
