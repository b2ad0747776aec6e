"""The Python sandbox refuses or kills what a program must not do, and says so.

Each refusal comes back as a result with a clear status and observation, never as an exception.
``namespaces`` tests are skipped, with the machine's reason, where Linux namespaces are refused;
``rlimits`` (the fallback) runs everywhere.
"""

from __future__ import annotations

import os
import socketserver
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from lrft.agents.sandbox import MiB, Sandbox, SandboxLimits, namespaces_refusal
from lrft.agents.tools import PythonTool
from lrft.api import ConfigError, Tool

LIMITS = SandboxLimits(wall_time_s=5.0, cpu_time_s=2, memory_bytes=256 * MiB, output_bytes=4096)
MODES = ["namespaces", "rlimits"]


def _sandbox(mode: str, limits: SandboxLimits = LIMITS) -> Sandbox:
    if mode == "namespaces":
        refusal = namespaces_refusal()
        if refusal is not None:
            pytest.skip(f"this machine refuses Linux namespaces: {refusal}")
    return Sandbox(limits, isolation=mode)  # type: ignore[arg-type]


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                continue
    return found


@pytest.mark.parametrize("mode", MODES)
def test_a_normal_program_runs_and_prints(mode: str) -> None:
    result = _sandbox(mode).run("import sys\nprint(sum(range(10)))\nprint('oops', file=sys.stderr)")
    assert result.status == "ok"
    assert result.stdout == "45\n"
    assert result.stderr == "oops\n"
    assert result.isolation == mode


@pytest.fixture
def server() -> Iterator[tuple[int, list[bytes]]]:
    received: list[bytes] = []

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            received.append(self.request.recv(16))

    with socketserver.TCPServer(("127.0.0.1", 0), Handler) as tcp:
        thread = threading.Thread(target=tcp.serve_forever, daemon=True)
        thread.start()
        yield tcp.server_address[1], received
        tcp.shutdown()


@pytest.mark.parametrize("mode", MODES)
def test_network_access_is_refused(mode: str, server: tuple[int, list[bytes]]) -> None:
    port, received = server
    connect = (
        f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        "s.sendall(b'hello')\nprint('connected')"
    )
    # The server is reachable from an ordinary process, so a refusal is the sandbox's doing.
    plain = subprocess.run([sys.executable, "-c", connect], capture_output=True, text=True)
    assert plain.stdout == "connected\n"
    received.clear()
    result = _sandbox(mode).run(connect)
    assert result.status == "error"
    assert "connected" not in result.stdout
    expected = "Network is unreachable" if mode == "namespaces" else "network access is disabled"
    assert expected in result.stderr
    assert received == []


@pytest.mark.parametrize("mode", MODES)
def test_writes_outside_the_working_directory_are_refused(mode: str, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    outside.chmod(0o777)  # so that file permissions alone would not stop the write
    code = (
        "import os\n"
        f"for path in ({str(outside / 'x')!r}, '/etc/lrft-sandbox-probe'):\n"
        "    try:\n"
        "        open(path, 'w').write('x')\n"
        "        print('wrote', path)\n"
        "    except OSError as error:\n"
        "        print('refused', type(error).__name__)\n"
        "open('inside.txt', 'w').write('kept')\n"
        "print(open('inside.txt').read())\n"
    )
    result = _sandbox(mode).run(code)
    assert result.status == "ok", result.stderr
    assert "wrote" not in result.stdout
    assert result.stdout.count("refused") == 2
    assert result.stdout.endswith("kept\n")
    assert not (outside / "x").exists()
    assert not Path("/etc/lrft-sandbox-probe").exists()


def test_host_files_are_invisible_and_the_root_read_only_in_namespaces(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("token")
    code = (
        f"import os\nprint(os.path.exists({str(secret)!r}), os.path.exists('/root/.bashrc'))\n"
        "print(os.getuid(), open('/proc/self/status').read().split('CapEff:')[1].split()[0])\n"
        "try:\n    open('/probe', 'w')\nexcept OSError as error:\n    print(error.strerror)"
    )
    result = _sandbox("namespaces").run(code)
    assert result.status == "ok", result.stderr
    visible, ids, root_write = result.stdout.splitlines()
    # the sandbox's root is a read-only mount, whatever its owner's permissions would allow
    assert root_write == "Read-only file system"
    assert visible == "False False"
    uid, capabilities = ids.split()
    assert int(capabilities, 16) == 0
    assert int(uid) == (65534 if os.geteuid() == 0 else os.geteuid())


@pytest.mark.parametrize("mode", MODES)
def test_runaway_memory_is_refused(mode: str) -> None:
    result = _sandbox(mode).run("blocks = []\nwhile True:\n    blocks.append(bytearray(32 << 20))")
    assert result.status == "memory_limit"
    assert "MemoryError" in result.stderr
    assert "256 MiB" in result.detail


def test_a_fork_bomb_is_refused_in_namespaces() -> None:
    # Room for every process's traceback, which would otherwise pass the output limit first.
    limits = SandboxLimits(output_bytes=1 * MiB, processes=16)
    result = _sandbox("namespaces", limits).run("import os\nwhile True:\n    os.fork()")
    assert result.status == "process_limit"
    assert "Resource temporarily unavailable" in result.stderr


def test_a_fork_bomb_that_survives_refusals_is_killed_whole() -> None:
    marker = f"lrft-bomb-{uuid.uuid4().hex}"
    limits = SandboxLimits(wall_time_s=2.0, processes=16)
    code = (
        "import os, sys\n"
        "bomb = 'import os, time\\nwhile True:\\n    try:\\n        os.fork()\\n"
        "    except OSError:\\n        time.sleep(0.01)'\n"
        f"os.execv(sys.executable, [sys.executable, '-c', bomb, {marker!r}])\n"
    )
    result = _sandbox("namespaces", limits).run(code)
    assert result.status == "wall_time_limit"
    assert "killed" in result.detail
    assert _processes_with(marker) == []


def test_processes_left_behind_are_killed_when_the_program_ends() -> None:
    marker = f"lrft-orphan-{uuid.uuid4().hex}"
    code = (
        "import os, sys\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}])\n"
        "print('parent done')\n"
    )
    result = _sandbox("namespaces").run(code)
    assert result.status == "ok"
    assert _processes_with(marker) == []


def test_starting_processes_is_refused_in_rlimits_mode() -> None:
    result = _sandbox("rlimits").run("import os\nos.fork()")
    assert result.status == "error"
    assert "starting processes is disabled" in result.stderr


@pytest.mark.parametrize("mode", MODES)
def test_a_program_that_hangs_is_timed_out(mode: str) -> None:
    limits = SandboxLimits(wall_time_s=1.0)
    result = _sandbox(mode, limits).run("import time\nprint('start')\ntime.sleep(60)")
    assert result.status == "wall_time_limit"
    assert result.stdout == "start\n"  # what it printed before it was killed is kept
    assert "wall-time limit of 1 s" in result.detail


def test_a_program_that_closes_its_output_and_hangs_is_timed_out() -> None:
    limits = SandboxLimits(wall_time_s=1.0)
    result = _sandbox("namespaces", limits).run(
        "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(60)"
    )
    assert result.status == "wall_time_limit"


@pytest.mark.parametrize("mode", MODES)
def test_a_busy_loop_is_stopped_by_the_cpu_limit(mode: str) -> None:
    limits = SandboxLimits(wall_time_s=30.0, cpu_time_s=1)
    result = _sandbox(mode, limits).run("while True:\n    pass")
    assert result.status == "cpu_time_limit"
    assert "CPU-time limit of 1 s" in result.detail


@pytest.mark.parametrize("mode", MODES)
def test_output_past_the_limit_stops_the_program(mode: str) -> None:
    result = _sandbox(mode).run("while True:\n    print('x' * 100)")
    assert result.status == "output_limit"
    assert len(result.stdout.encode()) <= LIMITS.output_bytes


def test_the_working_directory_is_size_limited() -> None:
    # Files each under the size limit of one file, together over the directory's size.
    limits = SandboxLimits(work_bytes=1 * MiB)
    code = "for i in range(4):\n    open(f'part{i}', 'wb').write(b'x' * (400 << 10))"
    result = _sandbox("namespaces", limits).run(code)
    assert result.status == "error"
    assert "No space left on device" in result.stderr


def test_a_program_over_the_code_limit_is_refused() -> None:
    result = Sandbox(SandboxLimits(code_bytes=10), isolation="rlimits").run("print('0123456789')")
    assert result.status == "invalid_input"


def test_runs_from_several_threads_stay_apart() -> None:
    sandbox = Sandbox(LIMITS)
    results: dict[int, str] = {}

    def run(index: int) -> None:
        results[index] = sandbox.run(f"print({index} * 11)").stdout

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results == {i: f"{i * 11}\n" for i in range(4)}


def test_the_python_tool_reports_every_ending_as_an_observation() -> None:
    tool = PythonTool(SandboxLimits(wall_time_s=1.0))
    assert isinstance(tool, Tool)
    assert tool.run("print(6 * 7)").output == "42"
    failed = tool.run("raise ValueError('bad input')")
    assert failed.status == "error"
    assert failed.output.endswith("ValueError: bad input\n[exit status 1]")
    hung = tool.run("import time\ntime.sleep(30)")
    assert hung.status == "wall_time_limit"
    assert hung.output == "[killed: the wall-time limit of 1 s was reached]"
    assert tool.run("x = 1").output == "[no output]"


def test_the_python_tool_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    tool = PythonTool(isolation="rlimits")

    def broken(code: str) -> None:
        raise OSError("No space left on device")

    monkeypatch.setattr(tool.sandbox, "run", broken)
    result = tool.run("print(1)")
    assert result.status == "sandbox_error"
    assert "No space left on device" in result.output


def test_an_unknown_isolation_is_refused() -> None:
    with pytest.raises(ConfigError, match="isolation must be"):
        Sandbox(isolation="docker")  # type: ignore[arg-type]


def test_the_root_holds_a_python_installed_under_tmp(tmp_path: Path) -> None:
    """A venv under /tmp (a checkout there, say) is bound inside /tmp of the root; the root is
    still built, with /tmp as that path's parent rather than a link to the working directory."""
    from lrft.agents.sandbox._runner import _skeleton

    root = tmp_path / "root"
    root.mkdir()
    _skeleton(root, ["/usr", "/tmp/checkout/.venv"], {}, "/sandbox")
    assert (root / "tmp" / "checkout" / ".venv").is_dir()
    assert not (root / "tmp").is_symlink()
    assert (root / "sandbox").is_dir()
