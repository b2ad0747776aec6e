"""Every assertion the shipped suites make says what it compared: a bare ``assert`` in a rank
worker fails with an empty ``AssertionError`` (pytest rewrites asserts only in test modules), and
``pytest.raises`` says only "DID NOT RAISE" without the call that did not."""

from __future__ import annotations

import ast
from pathlib import Path

import lrft.testing

TESTING = Path(lrft.testing.__file__).parent


def _modules() -> list[Path]:
    modules = sorted(TESTING.rglob("*.py"))
    assert len(modules) > 10, f"found only {modules} under {TESTING}"
    return modules


def test_every_assert_in_lrft_testing_has_a_message() -> None:
    bare = [
        f"{path.relative_to(TESTING)}:{node.lineno}: {ast.unparse(node)}"
        for path in _modules()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Assert) and node.msg is None
    ]
    assert bare == []


def test_lrft_testing_expects_errors_through_its_own_raises() -> None:
    calls = [
        f"{path.relative_to(TESTING)}:{node.lineno}"
        for path in _modules()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute)
        and node.attr == "raises"
        and isinstance(node.value, ast.Name)
        and node.value.id == "pytest"
    ]
    assert calls == []
