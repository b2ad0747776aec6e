"""A sandbox for untrusted Python: one program per run, in a process tree killed at the end.

:class:`Sandbox` runs a program's source with the standard library and the current
interpreter's site-packages, under :class:`SandboxLimits`. In ``namespaces`` mode (Linux user
namespaces, what ``auto`` picks where the machine allows them) the program has no network (a
network namespace of its own, with a loopback that is down), sees a read-only root made of the
system and Python directories only (no home directories, no ``/tmp`` of the host, no other
process), writes only to its private ``/work`` (a size-limited ``tmpfs``, gone with the run),
runs as an unprivileged user (``nobody`` when the caller is root), and lives in a PID
namespace whose every process the kernel kills when the run ends or is stopped. ``rlimits`` mode
is the fallback where namespaces are refused: the same resource limits and a private
directory, with an audit hook that refuses sockets, new processes, ``ctypes`` and writes outside
the directory. It is a best effort, not a security boundary.

A run never raises for anything the program does: how it ended is in :class:`SandboxResult`.
"""

from __future__ import annotations

import logging
import sys
import threading

from lrft.agents.sandbox import _runner
from lrft.agents.sandbox.limits import (
    Isolation,
    IsolationMode,
    MiB,
    SandboxLimits,
    SandboxResult,
)
from lrft.api.errors import ConfigError

logger = logging.getLogger(__name__)

_probe_lock = threading.Lock()
_namespaces_refused: dict[str, str] = {}  # python -> why namespaces cannot be used
_namespaces_checked: set[str] = set()
_fallback_warned: set[str] = set()


def namespaces_refusal(python: str | None = None) -> str | None:
    """Why namespaces mode cannot run ``python`` (default: this interpreter) on this machine,
    or ``None`` when it can. Found once per interpreter by running an empty program."""
    python = python or sys.executable
    with _probe_lock:
        if python not in _namespaces_checked:
            program = _runner.Program(
                code=b"", python=python, read_only_paths=(), limits=SandboxLimits()
            )
            try:
                result = _runner.run(program, "namespaces")
            except _runner.Unavailable as error:
                _namespaces_refused[python] = str(error)
            else:
                if result.status != "ok":
                    _namespaces_refused[python] = f"{result.detail} {result.stderr}".strip()
            _namespaces_checked.add(python)
        return _namespaces_refused.get(python)


class Sandbox:
    """Runs Python programs under ``limits``; thread-safe (each run is its own process tree).

    ``python``: the interpreter to run (default: this one, whose standard library and
    site-packages are made visible); another interpreter needs its own directories in
    ``read_only_paths``, which adds host directories the program may read. ``isolation``:
    see :data:`Isolation`; ``namespaces`` raises ``ConfigError`` here when this machine refuses
    them.
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        isolation: Isolation = "auto",
        python: str | None = None,
        read_only_paths: tuple[str, ...] = (),
    ) -> None:
        if isolation not in ("auto", "namespaces", "rlimits"):
            raise ConfigError(
                f"isolation must be 'auto', 'namespaces' or 'rlimits', got {isolation!r}"
            )
        self.limits = limits if limits is not None else SandboxLimits()
        self.python = python or sys.executable
        self.read_only_paths = tuple(read_only_paths)
        self._isolation = isolation
        if isolation == "namespaces":
            refusal = namespaces_refusal(self.python)
            if refusal is not None:
                raise ConfigError(
                    f"isolation='namespaces' but this machine refuses them ({refusal}); use "
                    "isolation='rlimits' (a best effort) or allow unprivileged user namespaces"
                )

    @property
    def isolation(self) -> IsolationMode:
        """The mode runs use: ``auto`` resolved (probing this machine on first use)."""
        if self._isolation != "auto":
            return self._isolation
        refusal = namespaces_refusal(self.python)
        if refusal is None:
            return "namespaces"
        with _probe_lock:
            warn = self.python not in _fallback_warned
            _fallback_warned.add(self.python)
        if warn:
            logger.warning(
                "sandbox: Linux namespaces are refused here (%s); programs run with resource "
                "limits and an audit hook only, which is not a security boundary",
                refusal,
            )
        return "rlimits"

    def run(self, code: str) -> SandboxResult:
        """Run ``code`` as a program's main module; never raises for what the program does."""
        source = code.encode()
        if len(source) > self.limits.code_bytes:
            return SandboxResult(
                status="invalid_input",
                detail=f"refused: the program has {len(source)} bytes, more than the limit of "
                f"{self.limits.code_bytes}",
                stdout="",
                stderr="",
                exit_code=None,
                signal=None,
                seconds=0.0,
                isolation=self.isolation,
            )
        program = _runner.Program(
            code=source,
            python=self.python,
            read_only_paths=self.read_only_paths,
            limits=self.limits,
        )
        try:
            return _runner.run(program, self.isolation)
        except _runner.Unavailable as error:
            # Namespaces worked when probed and fail now (the namespace limit reached, say).
            return SandboxResult(
                status="sandbox_error",
                detail=f"the sandbox failed to start: {error}",
                stdout="",
                stderr="",
                exit_code=None,
                signal=None,
                seconds=0.0,
                isolation="namespaces",
            )


__all__ = [
    "Isolation",
    "IsolationMode",
    "MiB",
    "Sandbox",
    "SandboxLimits",
    "SandboxResult",
    "namespaces_refusal",
]
