"""The command-line and config packages import no module that imports them back, counting the
imports inside functions (which hide a circle from import time, not from the reader)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[3] / "src"


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The lrft modules ``path`` imports anywhere in its body."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if name in modules else node.module)
    return found & modules


def _graph() -> dict[str, set[str]]:
    paths = {_module_name(path): path for path in (SRC / "lrft").rglob("*.py")}
    return {name: _imports(path, set(paths)) - {name} for name, path in paths.items()}


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> list[str] | None:
    """A chain of imports from ``start`` to ``goal``, or None."""
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop()
        for following in sorted(graph[path[-1]]):
            if following == goal:
                return [*path, goal]
            if following not in seen:
                seen.add(following)
                paths.append([*path, following])
    return None


GRAPH = _graph()


@pytest.mark.parametrize(
    "module",
    sorted(m for m in GRAPH if m.startswith(("lrft.cli", "lrft.config", "lrft.rm.config"))),
)
def test_no_import_circle_through(module: str) -> None:
    for imported in sorted(GRAPH[module]):
        back = _reaches(GRAPH, imported, module)
        assert back is None, f"{module} imports {' -> '.join(back or [])}"


def test_the_graph_sees_imports_inside_functions() -> None:
    # lrft.cli.__init__ imports the trainer's builder inside its main function only
    assert "lrft.trainer.split_build" in GRAPH["lrft.cli"]
