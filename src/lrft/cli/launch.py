"""What every ``lrft`` command does before it starts: a parser of its own, and the
environment of a one-rank process group when it runs outside torchrun."""

from __future__ import annotations

import argparse
import difflib
import os
import re
import socket
from collections.abc import Callable, Collection
from typing import Any, NoReturn

_UNKNOWN = re.compile(r"unrecognized arguments: (.*)")


def did_you_mean(flag: str, known: Collection[str]) -> str:
    """``did you mean --x or --y?`` for the known flags closest to ``flag``; empty when none is
    close (a typo's edit distance, not a guess at another setting)."""
    close = difflib.get_close_matches(flag, sorted(known), n=3, cutoff=0.8)
    return f"did you mean {' or '.join(close)}?" if close else ""


class SuggestingParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose unknown-flag error names the closest flags it knows (the
    argparse of Python 3.11 suggests nothing), over its own and its commands' flags."""

    def error(self, message: str) -> NoReturn:
        unknown = _UNKNOWN.match(message)
        if unknown is not None:
            known = sorted(self._known_flags())
            hints = []
            for token in unknown.group(1).split():
                name = token.split("=", 1)[0]
                if not name.startswith("--"):
                    continue
                hint = did_you_mean(name, known)
                if hint:
                    hints.append(f"{name}: {hint}")
            if hints:
                message = f"{message} ({'; '.join(hints)})"
        super().error(message)

    def _known_flags(self) -> set[str]:
        flags = {flag for flag in self._option_string_actions if flag.startswith("--")}
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for command in action.choices.values():
                    flags |= {flag for flag in command._option_string_actions if flag[:2] == "--"}
        return flags


def command_parser(add: Callable[[Any], argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """An ``lrft`` parser with the one command that ``add`` adds to the sub-command parsers."""
    parser = SuggestingParser(prog="lrft")
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
