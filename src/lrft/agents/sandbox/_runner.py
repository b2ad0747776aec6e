"""Running one untrusted Python program: the parent's side of the sandbox.

The launcher (``_launcher.py``, run as a script) isolates itself and runs the program; this side
builds its root directory, writes its id maps, enforces the wall-time and output limits, kills
the whole process tree when one is passed, and turns how the program ended into a
:class:`SandboxResult` the model can read.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from lrft.agents.sandbox.limits import IsolationMode, SandboxLimits, SandboxResult, describe
from lrft.api.tools import ToolStatus

LAUNCHER = Path(__file__).with_name("_launcher.py")
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
DEVICES = ("null", "zero", "random", "urandom")
NOBODY = 65534
WORK_DIRS = ("/tmp", "/sandbox")  # the first that no visible directory lies under
PROGRAM_FLAGS = ("-I", "-u", "-B")  # isolated mode, unbuffered output, no bytecode files
_HANDSHAKE_S = 10.0
_GRACE_S = 2.0


class Unavailable(Exception):
    """Namespaces cannot be used here; the message says what refused them."""


@attrs.frozen(kw_only=True)
class Program:
    """What one run needs: the source, the interpreter, what is visible, and the limits."""

    code: bytes
    python: str
    read_only_paths: tuple[str, ...]
    limits: SandboxLimits


def visible_paths(python: str, extra: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """Directories to bind read-only (outermost only) and symlinks to recreate, so that
    ``python`` runs inside the sandbox's root with its standard library and site-packages."""
    wanted = [*SYSTEM_PATHS, sys.base_prefix, sys.prefix, os.path.dirname(python), *extra]
    real: list[str] = []
    links: dict[str, str] = {}
    for path in wanted:
        path = os.path.abspath(path)
        if not os.path.lexists(path):
            continue
        resolved = os.path.realpath(path)
        if resolved != path:
            links[path] = resolved
        if os.path.isdir(resolved):
            real.append(resolved)
    binds: list[str] = []
    for path in sorted(set(real), key=len):
        if not any(path == b or path.startswith(b + "/") for b in binds):
            binds.append(path)

    def covered(path: str) -> bool:
        return any(path.startswith(b + "/") for b in binds)

    return binds, {link: target for link, target in links.items() if not covered(link)}


def work_dir(binds: Sequence[str], links: dict[str, str]) -> str:
    """Where the private working directory is mounted: a path that hides nothing visible."""
    visible = [*binds, *links]
    for candidate in WORK_DIRS:
        if not any(p == candidate or p.startswith(candidate + "/") for p in visible):
            return candidate
    raise ValueError(f"every working directory candidate {WORK_DIRS} is taken by {visible}")


def _skeleton(root: Path, binds: Sequence[str], links: dict[str, str], work: str) -> None:
    for path in binds:
        (root / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
    for link, target in links.items():
        at = root / link.lstrip("/")
        at.parent.mkdir(parents=True, exist_ok=True)
        if not at.exists():
            at.symlink_to(target)
    for name in ("proc", "dev", work.lstrip("/")):
        (root / name).mkdir(exist_ok=True)
    for device in DEVICES:
        (root / "dev" / device).touch()
    # /tmp leads to the working directory unless a bound path lives under it (a Python
    # installed under /tmp): then it is that path's parent, and TMPDIR still names the work.
    if work != "/tmp" and not (root / "tmp").exists():
        (root / "tmp").symlink_to(work)
    # Whatever the umask, the sandbox's user must be able to walk to what is mounted here.
    for directory, _, _ in os.walk(root):
        os.chmod(directory, 0o755)


def _program_env(work: str) -> dict[str, str]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8"}
    # One thread per numerical library: the process limit counts threads too.
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = "1"
    return env


def _limits(limits: SandboxLimits) -> dict[str, int]:
    return {
        "cpu_s": limits.cpu_time_s,
        "memory_bytes": limits.memory_bytes,
        "file_bytes": limits.work_bytes,
        "open_files": limits.open_files,
        "processes": limits.processes,
    }


def run(program: Program, mode: IsolationMode) -> SandboxResult:
    """Run ``program`` once under ``mode``; raises :class:`Unavailable` only in namespaces mode,
    before the program started, when this machine refuses namespaces."""
    start = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="lrft-sandbox-"))
    try:
        if mode == "namespaces":
            setup = _namespaces_setup(program, scratch / "root")
        else:
            workdir = scratch / "work"
            workdir.mkdir(mode=0o700)
            setup = {"workdir": str(workdir), "env": _program_env(str(workdir))}
        return _launch(program, mode, setup, start)
    finally:
        _remove(scratch)


def _namespaces_setup(program: Program, root: Path) -> dict[str, Any]:
    """Build the sandbox's root directory on the host (the mount points) and describe it."""
    binds, links = visible_paths(program.python, program.read_only_paths)
    root.mkdir()
    work = work_dir(binds, links)
    _skeleton(root, binds, links, work)
    uid, gid = (NOBODY, NOBODY) if os.geteuid() == 0 else (os.geteuid(), os.getegid())
    return {
        "ns": {
            "root": str(root),
            "binds": binds,
            "devices": list(DEVICES),
            "uid": uid,
            "gid": gid,
            "work": work,
            "work_bytes": program.limits.work_bytes,
            "drop_groups": os.geteuid() == 0,
        },
        "env": _program_env(work),
    }


def _launch(
    program: Program, mode: IsolationMode, setup: dict[str, Any], start: float
) -> SandboxResult:
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    status_r, status_w = os.pipe()
    config = {
        "mode": mode,
        "python": program.python,
        "flags": list(PROGRAM_FLAGS),
        "limits": _limits(program.limits),
        "fds": {"ready": ready_w, "go": go_r, "status": status_w},
        **setup,
    }
    try:
        process = subprocess.Popen(
            [sys.executable, "-I", "-S", str(LAUNCHER), json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(ready_w, go_r, status_w),
            start_new_session=True,  # its own process group, killed as one
            env={"PATH": "/usr/bin:/bin"},
        )
    finally:
        for fd in (ready_w, go_r, status_w):
            os.close(fd)
    unavailable = None
    stdout = stderr = b""
    stopped: ToolStatus | None = None
    try:
        assert process.stdin is not None
        process.stdin.write(program.code)
        process.stdin.close()
        if mode == "namespaces":
            unavailable = _write_id_maps(process, ready_r, go_w, setup["ns"])
        if unavailable is None:
            deadline = start + program.limits.wall_time_s
            stdout, stderr, stopped = _collect(process, deadline, program.limits.output_bytes)
    finally:
        _kill(process)
        for fd in (ready_r, go_w):
            os.close(fd)
        events = _read_status(status_r)
    if unavailable is not None:
        refused = [e["detail"] for e in events if e.get("event") == "unavailable"]
        raise Unavailable(refused[0] if refused else unavailable)
    return _result(program.limits, mode, stdout, stderr, stopped, events, start)


def _write_id_maps(
    process: subprocess.Popen[bytes], ready: int, go: int, ns: dict[str, Any]
) -> str | None:
    """Map the sandbox's one id once it has unshared (only a process outside may map
    ``nobody``); ``None`` when done, else why namespaces cannot be used."""
    selected, _, _ = _select([ready], _HANDSHAKE_S)
    answer = os.read(ready, 1) if selected else b""
    if answer != b"u":
        return f"the sandbox launcher did not start (answered {answer!r})"
    try:
        proc = Path(f"/proc/{process.pid}")
        (proc / "setgroups").write_text("deny")
        (proc / "uid_map").write_text(f"{ns['uid']} {ns['uid']} 1\n")
        (proc / "gid_map").write_text(f"{ns['gid']} {ns['gid']} 1\n")
    except OSError as error:
        os.write(go, b"x")
        return f"writing the user namespace's id maps: {error}"
    os.write(go, b"g")
    return None


def _select(fds: list[int], timeout: float) -> tuple[list[int], list[int], list[int]]:
    return select.select(fds, [], [], max(timeout, 0.0))


def _collect(
    process: subprocess.Popen[bytes], deadline: float, limit: int
) -> tuple[bytes, bytes, ToolStatus | None]:
    """Read the program's output until it exits, its output passes the limit or time is up."""
    assert process.stdout is not None
    assert process.stderr is not None
    streams = {process.stdout.fileno(): bytearray(), process.stderr.fileno(): bytearray()}
    total = 0
    stopped: ToolStatus | None = None
    with selectors.DefaultSelector() as selector:
        for fd in streams:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map() and stopped is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                stopped = "wall_time_limit"
                break
            for key, _ in selector.select(remaining):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                streams[key.fd] += chunk[: max(limit - total, 0)]
                total += len(chunk)
                if total > limit:
                    stopped = "output_limit"
    if stopped is None:
        try:
            # Output closed, yet a process may still run (it closed its streams): wait for it.
            process.wait(max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            stopped = "wall_time_limit"
    out, err = streams.values()
    return bytes(out), bytes(err), stopped


def _kill(process: subprocess.Popen[bytes]) -> None:
    """Kill the launcher's process group. In namespaces mode the sandbox's init dies with the
    launcher, and with it every process in the sandbox; then wait for the streams to close."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    for stream in (process.stdout, process.stderr):
        if stream is None:
            continue
        deadline = time.monotonic() + _GRACE_S
        while time.monotonic() < deadline:
            ready, _, _ = _select([stream.fileno()], deadline - time.monotonic())
            if not ready or not os.read(stream.fileno(), 65536):
                break
        stream.close()


def _read_status(fd: int) -> list[dict[str, Any]]:
    data = b""
    deadline = time.monotonic() + _GRACE_S
    while time.monotonic() < deadline:
        ready, _, _ = _select([fd], deadline - time.monotonic())
        if not ready:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    os.close(fd)
    events = []
    for line in data.decode(errors="replace").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def _result(
    limits: SandboxLimits,
    mode: IsolationMode,
    stdout: bytes,
    stderr: bytes,
    stopped: ToolStatus | None,
    events: list[dict[str, Any]],
    start: float,
) -> SandboxResult:
    exit_code = signal_number = None
    setup_error = None
    for event in events:
        if event.get("event") == "exit":
            exit_code = int(event["code"])
        elif event.get("event") == "signal":
            signal_number = int(event["signal"])
        elif event.get("event") in ("setup_error", "unavailable"):
            setup_error = str(event["detail"])
    err = stderr.decode(errors="replace")
    status, detail = describe(
        limits,
        stopped=stopped,
        setup_error=setup_error,
        exit_code=exit_code,
        signal_number=signal_number,
        stderr=err,
    )
    return SandboxResult(
        status=status,
        detail=detail,
        stdout=stdout.decode(errors="replace"),
        stderr=err,
        exit_code=exit_code,
        signal=signal_number,
        seconds=time.monotonic() - start,
        isolation=mode,
    )


def _remove(scratch: Path) -> None:
    # The sandbox's mounts live in its own mount namespace, gone with its last process; a mount
    # still visible here would mean a bind of a host directory, which removal must not follow.
    with open("/proc/self/mountinfo") as mounts:
        if any(str(scratch) in line for line in mounts):
            return
    shutil.rmtree(scratch, ignore_errors=True)
