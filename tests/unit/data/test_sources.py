"""Reading rows from each local source kind, and the errors that name the file and the row."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lrft.api import ConfigError
from lrft.data import PromptDataError, read_rows

ROWS: list[dict[str, Any]] = [
    {"question": "1+1", "answer": "2", "level": 1},
    {"question": "2*3", "answer": "6", "level": 2},
    {"question": "9-4", "answer": "5", "level": 1},
]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    pa = pytest.importorskip("pyarrow")
    parquet = pytest.importorskip("pyarrow.parquet")
    parquet.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_datasets_folder(
    path: Path,
    splits: dict[str, list[dict[str, Any]]] | None = None,
    rows: list[dict[str, Any]] | None = None,
) -> Path:
    datasets = pytest.importorskip("datasets")
    if splits is not None:
        datasets.DatasetDict(
            {name: datasets.Dataset.from_list(part) for name, part in splits.items()}
        ).save_to_disk(str(path))
    else:
        datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return path


def values(path: Path, split: str | None = None) -> list[dict[str, object]]:
    return [dict(row.values) for row in read_rows(path, split=split).rows]


def test_jsonl_rows_in_order_with_blank_lines_skipped(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(
        json.dumps(ROWS[0]) + "\n\n" + json.dumps(ROWS[1]) + "\n" + json.dumps(ROWS[2]),
        encoding="utf-8",
    )
    source = read_rows(path)
    assert [dict(row.values) for row in source.rows] == ROWS
    assert [row.index for row in source.rows] == [0, 1, 2]
    assert [row.where for row in source.rows] == [
        "row 0 (line 1)",
        "row 1 (line 3)",
        "row 2 (line 4)",
    ]
    assert source.name == str(path)


def test_json_array_and_json_lines_both_read(tmp_path: Path) -> None:
    array = tmp_path / "a.json"
    array.write_text(json.dumps(ROWS, indent=2), encoding="utf-8")
    lines = write_jsonl(tmp_path / "l.json", ROWS)
    assert values(array) == ROWS
    assert values(lines) == ROWS


def test_parquet_rows_equal_the_written_rows(tmp_path: Path) -> None:
    assert values(write_parquet(tmp_path / "p.parquet", ROWS)) == ROWS


def test_datasets_folder_rows_equal_the_written_rows(tmp_path: Path) -> None:
    assert values(write_datasets_folder(tmp_path / "ds", rows=ROWS)) == ROWS


def test_dataset_dict_folder_defaults_to_train_and_picks_a_split(tmp_path: Path) -> None:
    folder = write_datasets_folder(tmp_path / "dd", splits={"train": ROWS[:2], "test": ROWS[2:]})
    assert values(folder) == ROWS[:2]
    assert values(folder, split="test") == ROWS[2:]
    with pytest.raises(ConfigError, match=r"split 'validation' is not in .*test, train"):
        read_rows(folder, split="validation")


def test_split_on_a_source_without_splits_is_an_error_not_ignored(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="split='test' applies only to a DatasetDict"):
        read_rows(write_jsonl(tmp_path / "p.jsonl", ROWS), split="test")
    with pytest.raises(ConfigError, match="single Dataset"):
        read_rows(write_datasets_folder(tmp_path / "ds", rows=ROWS), split="test")


def test_a_missing_path_says_hub_names_are_not_downloaded(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="hub data sets are never downloaded"):
        read_rows("openai/gsm8k")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_rows(tmp_path / "nope.jsonl")


def test_unsupported_suffix_and_foreign_folder(tmp_path: Path) -> None:
    csv = tmp_path / "p.csv"
    csv.write_text("question,answer\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"unsupported suffix '\.csv'"):
        read_rows(csv)
    (tmp_path / "plain").mkdir()
    with pytest.raises(ConfigError, match="not written by datasets' save_to_disk"):
        read_rows(tmp_path / "plain")


def test_a_broken_line_is_named_by_row_and_line(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n{not json\n", encoding="utf-8")
    with pytest.raises(PromptDataError, match=r"p\.jsonl row 1 \(line 3\) is not valid JSON"):
        read_rows(path)


def test_a_row_that_is_not_an_object_is_named(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(["a", "b"]) + "\n", encoding="utf-8")
    with pytest.raises(PromptDataError, match=r"row 1 \(line 2\) is not an object .* got list"):
        read_rows(path)


def test_missing_optional_package_names_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parquet = write_parquet(tmp_path / "p.parquet", ROWS)
    folder = write_datasets_folder(tmp_path / "ds", rows=ROWS)
    # None in sys.modules makes the import fail as if the package were absent.
    for name in ("pyarrow", "pyarrow.parquet", "datasets"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match=r"needs the 'pyarrow' package.*pip install"):
        read_rows(parquet)
    with pytest.raises(ImportError, match=r"needs the 'datasets' package.*pip install"):
        read_rows(folder)


def test_importing_lrft_data_imports_neither_pyarrow_nor_datasets() -> None:
    code = (
        "import sys, lrft.data; "
        "print(sorted(m for m in ('pyarrow', 'datasets', 'pandas') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == "[]"
