"""The sandbox's first process: isolates itself, then runs the untrusted program.

Run as a script (``python -I -S <this file> <config json>``) with the program's source on stdin,
never imported by lrft: it uses the standard library only and starts in a few milliseconds.
``lrft.agents.sandbox._runner`` builds the configuration and reads what this reports, one JSON
object per line, on the status pipe: ``{"event": "unavailable" | "setup_error", "detail": str}``
or ``{"event": "exit", "code": int}`` / ``{"event": "signal", "signal": int}`` for the program.

``namespaces`` mode (Linux user namespaces):

1. this process drops its supplementary groups (when it may) and unshares new user, mount,
   network, PID, IPC and UTS namespaces, then waits for the parent to write its uid/gid maps
   (one id: the caller's own, or ``nobody`` when the caller is root, so that inside the sandbox
   the program holds no privilege over any file outside it);
2. it forks the new PID namespace's init, which builds the sandbox's root out of read-only bind
   mounts of the system and Python directories, a fresh ``/proc``, four device nodes and a
   size-limited private ``tmpfs`` at ``/work``, enters it (``chroot``), takes the mapped ids and
   forks the program with its resource limits; when the program exits, init exits, and the
   kernel kills everything left in the namespace;
3. init dies with this process (``PR_SET_PDEATHSIG``), so killing this process kills the tree.

``rlimits`` mode (no namespaces): resource limits, a private working directory, and an audit
hook in the program's interpreter that refuses sockets, new processes, ``ctypes`` and writes
outside the directory. That is a best effort, not a security boundary: code that escapes the
interpreter's audit events escapes it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import signal
import sys
from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38

# statvfs flag -> mount flag. A bind mount made inside a user namespace inherits its source's
# locked flags (nosuid, nodev, noexec, atime): a read-only remount must repeat them or fail.
_KEPT_FLAGS = (
    (os.ST_NOSUID, MS_NOSUID),
    (os.ST_NODEV, MS_NODEV),
    (os.ST_NOEXEC, MS_NOEXEC),
    (os.ST_NOATIME, MS_NOATIME),
    (os.ST_NODIRATIME, MS_NODIRATIME),
    (os.ST_RELATIME, MS_RELATIME),
)

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    _check(
        _libc.mount(
            None if source is None else source.encode(),
            target.encode(),
            None if fstype is None else fstype.encode(),
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {source or fstype} on {target}",
    )


def _bind_read_only(source: str, target: str) -> None:
    _mount(source, target, None, MS_BIND | MS_REC)
    kept = 0
    for stat_flag, mount_flag in _KEPT_FLAGS:
        if os.statvfs(target).f_flag & stat_flag:
            kept |= mount_flag
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)


def _report(status: int, event: str, **fields: Any) -> None:
    os.write(status, (json.dumps({"event": event, **fields}) + "\n").encode())


def _set_limits(limits: dict[str, int], *, processes: bool) -> None:
    # The CPU limit's soft value sends SIGXCPU; the hard one, a second later, SIGKILL.
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"], limits["memory_bytes"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"], limits["file_bytes"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"], limits["open_files"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if processes:
        resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"], limits["processes"]))


def _exec_program(config: dict[str, Any], argv: list[str]) -> None:
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)
    os.execve(config["python"], [config["python"], *argv], config["env"])


def _wait_status(status: int, pid: int) -> None:
    _, code = os.waitpid(pid, 0)
    if os.WIFSIGNALED(code):
        _report(status, "signal", signal=os.WTERMSIG(code))
    else:
        _report(status, "exit", code=os.WEXITSTATUS(code))


# --- namespaces mode -----------------------------------------------------------------------


def _build_root(ns: dict[str, Any]) -> None:
    root = ns["root"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here reaches the host
    _bind_read_only(root, root)
    for path in ns["binds"]:
        _bind_read_only(path, root + path)
    for device in ns["devices"]:
        _mount("/dev/" + device, f"{root}/dev/{device}", None, MS_BIND)
    # A container may mask parts of /proc, which forbids a new one: go without.
    with contextlib.suppress(OSError):
        _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    options = f"size={ns['work_bytes']},mode=0700,uid={ns['uid']},gid={ns['gid']}"
    _mount("tmpfs", root + ns["work"], "tmpfs", MS_NOSUID | MS_NODEV, options)
    os.chroot(root)
    os.chdir(ns["work"])


def _init(config: dict[str, Any], code: bytes, status: int, alive: int) -> None:
    """PID 1 of the sandbox: build it, run the program as its child, report how it ended."""
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
    os.set_blocking(alive, False)
    try:
        if os.read(alive, 1) == b"":
            os._exit(1)  # the launcher died before the line above took effect
    except BlockingIOError:
        pass
    ns = config["ns"]
    try:
        _build_root(ns)
        os.setresgid(ns["gid"], ns["gid"], ns["gid"])
        os.setresuid(ns["uid"], ns["uid"], ns["uid"])
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
        with open("main.py", "wb") as file:
            file.write(code)
    except OSError as error:
        _report(status, "setup_error", detail=str(error))
        os._exit(1)
    program = os.fork()
    if program == 0:
        try:
            _set_limits(config["limits"], processes=True)
            os.set_inheritable(status, False)
            _exec_program(config, [*config["flags"], "main.py"])
        except OSError as error:
            _report(status, "setup_error", detail=f"exec {config['python']}: {error}")
        os._exit(127)
    # As init, reap every orphan until the program itself is done.
    while True:
        pid, code_ = os.wait()
        if pid == program:
            if os.WIFSIGNALED(code_):
                _report(status, "signal", signal=os.WTERMSIG(code_))
            else:
                _report(status, "exit", code=os.WEXITSTATUS(code_))
            os._exit(0)


def _namespaces(config: dict[str, Any], code: bytes) -> None:
    fds = config["fds"]
    status = fds["status"]
    try:
        if config["ns"]["drop_groups"]:
            os.setgroups([])
        flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC
        _check(_libc.unshare(flags | CLONE_NEWUTS), "unshare")
    except OSError as error:
        _report(status, "unavailable", detail=str(error))
        os.write(fds["ready"], b"n")
        return
    os.write(fds["ready"], b"u")
    if os.read(fds["go"], 1) != b"g":
        return  # the parent could not write the id maps and has reported it
    alive_read, alive_write = os.pipe()
    init = os.fork()
    if init == 0:
        os.close(alive_write)
        _init(config, code, status, alive_read)
        os._exit(1)
    os.close(alive_read)
    os.waitpid(init, 0)


# --- rlimits mode --------------------------------------------------------------------------

_GUARD = r"""
import os, sys
_work = os.path.realpath(os.getcwd())
_spawning = {"os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system",
             "subprocess.Popen", "pty.spawn"}
_write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_path_events = {"os.remove": 1, "os.rename": 2, "os.rmdir": 1, "os.mkdir": 1, "os.symlink": 2,
                "os.link": 2, "os.chmod": 1, "os.chown": 1, "os.truncate": 1, "os.utime": 1,
                "shutil.rmtree": 1}

def _inside(path):
    if isinstance(path, int):
        return True
    real = os.path.realpath(os.fsdecode(path))
    return real == _work or real.startswith(_work + os.sep) or real == os.devnull

def _guard(event, args):
    if event == "socket.__new__":
        raise PermissionError("sandbox: network access is disabled")
    if event in _spawning or (event == "import" and args[0] == "_posixsubprocess"):
        raise PermissionError("sandbox: starting processes is disabled")
    if event == "ctypes.dlopen":
        raise PermissionError("sandbox: ctypes is disabled")
    if event == "open":
        path, mode, flags = args
        writes = (mode is not None and any(c in mode for c in "wax+")) or bool(
            flags & _write_flags)
        if writes and not _inside(path):
            raise PermissionError(f"sandbox: writing outside the working directory: {path!r}")
    count = _path_events.get(event)
    if count:
        for path in args[:count]:
            if path is not None and not _inside(path):
                raise PermissionError(f"sandbox: {event} outside the working directory")

sys.addaudithook(_guard)
del _guard
with open("main.py", "rb") as _file:
    _source = _file.read()
exec(compile(_source, "main.py", "exec"), {"__name__": "__main__"})
"""


def _rlimits(config: dict[str, Any], code: bytes) -> None:
    status = config["fds"]["status"]
    try:
        os.chdir(config["workdir"])
        with open("main.py", "wb") as file:
            file.write(code)
        # The process limit counts every process of the user, the caller's included, and is
        # not enforced for root: the audit hook refuses new processes instead.
        _set_limits(config["limits"], processes=False)
    except OSError as error:
        _report(status, "setup_error", detail=str(error))
        return
    program = os.fork()
    if program == 0:
        try:
            os.set_inheritable(status, False)
            _exec_program(config, [*config["flags"], "-c", _GUARD])
        except OSError as error:
            _report(status, "setup_error", detail=f"exec {config['python']}: {error}")
        os._exit(127)
    _wait_status(status, program)


def main() -> None:
    config = json.loads(sys.argv[1])
    code = sys.stdin.buffer.read()
    if config["mode"] == "namespaces":
        _namespaces(config, code)
    else:
        _rlimits(config, code)


if __name__ == "__main__":
    main()
