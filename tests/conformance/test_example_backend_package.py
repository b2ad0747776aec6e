"""The example third-party backend (``examples/lrft-example-backend``) is what an author copies:
it builds as a package of its own and reaches lrft through public modules only, so the suites
it runs need nothing a pip install of lrft lacks. Its own tests (the three suites) run in CI
from ``scripts/test.sh`` after installing it, as its author would."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lrft-example-backend"


def _imported_modules(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return names


def test_example_imports_no_private_lrft_module() -> None:
    sources = sorted(EXAMPLE.rglob("*.py"))
    assert len(sources) >= 5, f"the example's sources: {sources}"
    private = [
        f"{path.relative_to(EXAMPLE)}: {module}"
        for path in sources
        for module in _imported_modules(path)
        if module.split(".")[0] == "lrft"
        and any(part.startswith("_") for part in module.split("."))
    ]
    assert private == []


def test_example_builds_as_a_package(tmp_path: Path) -> None:
    pytest.importorskip("setuptools", reason="building the example's wheel needs setuptools")
    # from a copy: setuptools builds in the source tree
    source = shutil.copytree(
        EXAMPLE, tmp_path / "source", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path / "wheels"), str(source)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    [wheel] = (tmp_path / "wheels").glob("lrft_example_backend-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"lrft_example_backend/{m}.py" for m in ("__init__", "engine", "sync", "train")}
    assert expected | {"lrft_example_backend/py.typed"} <= names, sorted(names)
