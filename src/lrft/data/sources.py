"""Reading prompt rows from local files: JSON lines, JSON, Parquet and ``datasets`` folders.

Only local paths are read. A Hugging Face hub name is never downloaded: save the data set with
``datasets``' ``save_to_disk`` (or export it to JSONL/Parquet) and pass that path. ``pyarrow``
and ``datasets`` are imported on first use, so ``import lrft.data`` needs neither.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs

from lrft.api import validators as v
from lrft.api.errors import ConfigError
from lrft.data.errors import PromptDataError

JSON_SUFFIXES = (".jsonl", ".json")
PARQUET_SUFFIXES = (".parquet",)


@attrs.frozen(kw_only=True)
class SourceRow:
    """One row of a source: its 0-based index, where it is (for messages) and its columns."""

    index: int
    where: str
    values: Mapping[str, object] = attrs.field(converter=v.read_only)

    def describe_keys(self) -> str:
        return ", ".join(repr(key) for key in self.values) or "none"


@attrs.frozen(kw_only=True)
class RowSource:
    """Every row of one source, in file order; ``name`` is the path as given."""

    name: str
    rows: tuple[SourceRow, ...]


def import_optional(module: str, package: str, purpose: str, *, extra: str = "data") -> ModuleType:
    """Import ``module`` or raise an ``ImportError`` that says what to install (``extra``: the
    lrft extra that holds ``package``)."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"{purpose} needs the {package!r} package, which is not installed: "
            f"pip install 'lrft[{extra}]' (or pip install {package})"
        ) from error


def read_rows(path: str | os.PathLike[str], *, split: str | None = None) -> RowSource:
    """Read every row of a local prompt source.

    - ``*.jsonl``: one JSON object per line (blank lines are skipped);
    - ``*.json``: a JSON array of objects, or JSON lines;
    - ``*.parquet``: a Parquet file (needs ``pyarrow``);
    - a folder written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk`` (needs
      ``datasets``). ``split`` picks the split of a ``DatasetDict`` (default ``train``); it is an
      error to give it for any other source, since it would be ignored.
    """
    source = Path(path)
    name = str(path)
    if not source.exists():
        raise FileNotFoundError(
            f"prompt data {name!r} does not exist. lrft reads local files and folders only "
            "(JSONL, JSON, Parquet, or a folder saved with datasets' save_to_disk); hub data sets "
            "are never downloaded"
        )
    if source.is_dir():
        return RowSource(name=name, rows=_read_datasets_folder(source, split))
    if split is not None:
        raise ConfigError(f"split={split!r} applies only to a DatasetDict folder, not to {name!r}")
    suffix = source.suffix.lower()
    if suffix in JSON_SUFFIXES:
        return RowSource(name=name, rows=_read_json(source))
    if suffix in PARQUET_SUFFIXES:
        return RowSource(name=name, rows=_read_parquet(source))
    raise ConfigError(
        f"prompt data {name!r} has an unsupported suffix {suffix!r}: expected one of "
        f"{', '.join(JSON_SUFFIXES + PARQUET_SUFFIXES)}, or a datasets folder"
    )


def check_split(path: str | os.PathLike[str], split: str | None) -> None:
    """The ``split`` of an existing prompt source exists, read from its metadata alone (no rows
    loaded): what :func:`read_rows` would refuse, before any process group starts."""
    source = Path(path)
    if not source.exists():
        return  # named missing by the inputs' checks
    if not source.is_dir():
        if split is not None:
            raise ConfigError(
                f"split={split!r} applies only to a DatasetDict folder, not to {str(path)!r}"
            )
        return
    listing = source / "dataset_dict.json"
    if not listing.is_file():
        if split is not None and (source / "state.json").is_file():
            raise ConfigError(
                f"split={split!r} applies only to a DatasetDict folder; {str(path)!r} holds a "
                "single Dataset"
            )
        return
    try:
        splits = sorted(str(name) for name in json.loads(listing.read_text())["splits"])
    except (OSError, ValueError, KeyError, TypeError):
        return  # unreadable metadata: datasets' own loader reports it
    chosen = "train" if split is None else split
    if chosen not in splits:
        raise ConfigError(
            f"split {chosen!r} is not in {str(path)!r}; its splits are {', '.join(splits)}"
        )


def _row(values: object, index: int, where: str, source: Path) -> SourceRow:
    if not isinstance(values, Mapping) or not all(isinstance(key, str) for key in values):
        raise PromptDataError(
            f"{source} {where} is not an object with string keys: got {type(values).__name__}"
        )
    return SourceRow(index=index, where=where, values=values)


def _read_json(source: Path) -> tuple[SourceRow, ...]:
    text = source.read_text(encoding="utf-8")
    if source.suffix.lower() == ".json" and text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as error:
            raise PromptDataError(f"{source} is not valid JSON: {error}") from error
        return tuple(_row(item, i, f"row {i}", source) for i, item in enumerate(items))
    rows: list[SourceRow] = []
    for line_number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"row {len(rows)} (line {line_number})"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as error:
            raise PromptDataError(f"{source} {where} is not valid JSON: {error}") from error
        rows.append(_row(item, len(rows), where, source))
    return tuple(rows)


def _rows_from_pylist(items: list[Any], source: Path) -> tuple[SourceRow, ...]:
    return tuple(_row(item, i, f"row {i}", source) for i, item in enumerate(items))


def _read_parquet(source: Path) -> tuple[SourceRow, ...]:
    parquet = import_optional("pyarrow.parquet", "pyarrow", "reading Parquet prompt data")
    # pyarrow is untyped; its result is turned into plain rows right here.
    items: list[Any] = parquet.read_table(source).to_pylist()
    return _rows_from_pylist(items, source)


def _read_datasets_folder(folder: Path, split: str | None) -> tuple[SourceRow, ...]:
    is_dict = (folder / "dataset_dict.json").is_file()
    if not is_dict and not (folder / "state.json").is_file():
        raise ConfigError(
            f"prompt data folder {str(folder)!r} was not written by datasets' save_to_disk "
            "(it has neither dataset_dict.json nor state.json)"
        )
    if not is_dict and split is not None:
        raise ConfigError(
            f"split={split!r} applies only to a DatasetDict folder; {str(folder)!r} holds a "
            "single Dataset"
        )
    datasets = import_optional("datasets", "datasets", "reading a datasets folder")
    loaded: Any = datasets.load_from_disk(str(folder))
    if is_dict:
        splits = sorted(str(key) for key in loaded)
        chosen = "train" if split is None else split
        if chosen not in splits:
            raise ConfigError(
                f"split {chosen!r} is not in {str(folder)!r}; its splits are {', '.join(splits)}"
            )
        loaded = loaded[chosen]
    items: list[Any] = loaded.to_list()
    return _rows_from_pylist(items, folder)
