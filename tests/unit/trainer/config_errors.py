"""Reading ``lrft train``'s configuration-error message: one message, its problems listed."""

from __future__ import annotations

import re

PREFIX = "lrft: configuration error: "
HEADER = re.compile(r"(\d+) problems, each to fix before the run can start:")
ITEM = re.compile(r"  (\d+)\. (.+)")


def config_problems(err: str) -> list[str]:
    """The problems of the one configuration-error message ``err`` holds, after asserting it is
    one message (a problem on its line, or a counted header over numbered problems)."""
    lines = err.splitlines()
    assert lines, err
    assert lines[0].startswith(PREFIX), err
    first = lines[0].removeprefix(PREFIX)
    if len(lines) == 1:
        return [first]
    header = HEADER.fullmatch(first)
    assert header is not None, err
    items = [ITEM.fullmatch(line) for line in lines[1:]]
    assert all(item is not None for item in items), err
    numbers = [int(item[1]) for item in items if item is not None]
    assert numbers == list(range(1, len(items) + 1)) == list(range(1, int(header[1]) + 1)), err
    return [item[2] for item in items if item is not None]
