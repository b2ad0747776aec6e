"""What every ``lrft`` command does before it starts: a parser of its own, and the
environment of a one-rank process group when it runs outside torchrun."""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Callable
from typing import Any


def command_parser(add: Callable[[Any], argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """An ``lrft`` parser with the one command that ``add`` adds to the sub-command parsers."""
    parser = argparse.ArgumentParser(prog="lrft")
    add(parser.add_subparsers(dest="command", required=True))
    return parser


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def single_process_env(*, any_port: bool = False) -> None:
    """The variables torchrun sets, for a command run as one process (``lrft train`` outside
    torchrun); values already set are kept. ``any_port``: a free port rather than lrft train's
    fixed one, so that two such commands can run side by side."""
    if any_port and "RANK" not in os.environ:
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    for name, value in (
        ("RANK", "0"),
        ("LOCAL_RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("LOCAL_WORLD_SIZE", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29512"),
    ):
        os.environ.setdefault(name, value)
