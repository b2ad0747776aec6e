"""The sandbox's limits, what one run reports, and how an ending reads to the model."""

from __future__ import annotations

import signal
from typing import Literal

import attrs

from lrft.api import validators as v
from lrft.api.tools import ToolStatus

MiB = 1 << 20

Isolation = Literal["auto", "namespaces", "rlimits"]
"""How a sandbox isolates its program: ``namespaces`` (Linux user, mount, network and PID
namespaces, plus resource limits), ``rlimits`` (resource limits and an audit hook: a best
effort), or ``auto``: namespaces where this machine allows them, else rlimits with a warning."""
IsolationMode = Literal["namespaces", "rlimits"]


@attrs.frozen(kw_only=True)
class SandboxLimits:
    """Limits of one run; each stops or refuses the program and says so.

    - ``wall_time_s``: real time from start to exit; past it every process is killed;
    - ``cpu_time_s``: CPU seconds per process (``RLIMIT_CPU``, whole seconds);
    - ``memory_bytes``: address space per process (``RLIMIT_AS``): an allocation past it fails
      (``MemoryError`` in Python);
    - ``output_bytes``: stdout and stderr together; past it every process is killed and the
      output kept up to the limit;
    - ``work_bytes``: the size of the private working directory (a ``tmpfs`` in namespaces
      mode) and of the largest file any process may write (``RLIMIT_FSIZE``);
    - ``processes``: processes and threads of the sandbox together (``RLIMIT_NPROC``, counted in
      the sandbox's own user namespace; namespaces mode only, rlimits mode refuses new processes);
    - ``open_files``: file descriptors per process (``RLIMIT_NOFILE``);
    - ``code_bytes``: the largest program accepted.
    """

    wall_time_s: float = attrs.field(default=10.0, validator=[v.finite, v.positive_number])
    cpu_time_s: int = attrs.field(default=5, validator=v.positive_int)
    memory_bytes: int = attrs.field(default=512 * MiB, validator=v.positive_int)
    output_bytes: int = attrs.field(default=16 * 1024, validator=v.positive_int)
    work_bytes: int = attrs.field(default=16 * MiB, validator=v.positive_int)
    processes: int = attrs.field(default=32, validator=v.positive_int)
    open_files: int = attrs.field(default=64, validator=v.positive_int)
    code_bytes: int = attrs.field(default=64 * 1024, validator=v.positive_int)


@attrs.frozen(kw_only=True)
class SandboxResult:
    """How one run ended: ``status`` as a tool status, ``detail`` in words for the model."""

    status: ToolStatus
    detail: str
    stdout: str
    stderr: str
    exit_code: int | None
    signal: int | None
    seconds: float
    isolation: IsolationMode


def _mib(n: int) -> str:
    return f"{n / MiB:g} MiB"


def describe(
    limits: SandboxLimits,
    *,
    stopped: ToolStatus | None,
    setup_error: str | None,
    exit_code: int | None,
    signal_number: int | None,
    stderr: str,
) -> tuple[ToolStatus, str]:
    """The status and the sentence that tell the model how its program ended."""
    if stopped == "output_limit":
        return stopped, f"stopped: the output passed its limit of {limits.output_bytes} bytes"
    if stopped == "wall_time_limit":
        return stopped, f"killed: the wall-time limit of {limits.wall_time_s:g} s was reached"
    if setup_error is not None:
        return "sandbox_error", f"the sandbox failed to start: {setup_error}"
    if signal_number is not None:
        if signal_number in (signal.SIGXCPU, signal.SIGKILL):
            # SIGKILL with no kill of ours is the CPU limit's hard value.
            return "cpu_time_limit", (
                f"killed: the CPU-time limit of {limits.cpu_time_s} s was reached"
            )
        return "error", f"killed by signal {signal.Signals(signal_number).name}"
    if exit_code is None:
        return "sandbox_error", "the sandbox reported no exit status"
    if exit_code == 0:
        return "ok", ""
    last = next((line for line in reversed(stderr.splitlines()) if line.strip()), "")
    if last.startswith("MemoryError"):
        return "memory_limit", f"the memory limit of {_mib(limits.memory_bytes)} was reached"
    if "BlockingIOError: [Errno 11]" in stderr:
        return "process_limit", f"the process limit of {limits.processes} was reached"
    return "error", f"exit status {exit_code}"
