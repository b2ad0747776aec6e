"""``lrft bench`` writes its JSON document after each part, so a run stopped part-way (a time
limit, a failure) keeps what it measured and names what it did not reach."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest

from lrft.bench.run import BenchSettings

# the module (``lrft.bench.run`` the attribute is its function of that name)
bench_run = importlib.import_module("lrft.bench.run")


def test_a_failed_part_leaves_the_parts_before_it_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    output = tmp_path / "doc.json"
    seen: list[dict[str, Any]] = []

    def fake_part(part: str, *_: Any) -> dict[str, Any]:
        if output.exists():
            seen.append(json.loads(output.read_text()))
        if part == "sync":
            raise RuntimeError("the third part fails")
        return {"measured": part}

    monkeypatch.setattr(bench_run, "_run_part", fake_part)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.setenv(name, "0" if "RANK" in name else "1")
    settings = BenchSettings(mode="all", workload="tiny", output=output, work_dir=tmp_path)
    with pytest.raises(RuntimeError, match="third part"):
        bench_run.run(settings)
    document = json.loads(output.read_text())
    assert document["grpo"] == {"measured": "grpo"}
    assert document["train_mfu"] == {"measured": "train_mfu"}
    assert "sync" not in document
    assert document["parts_pending"] == ["sync", "sleep"]
    # the document on disk when the second part started held the first one already
    assert seen[0]["grpo"] == {"measured": "grpo"}
    assert seen[0]["parts_pending"] == ["train_mfu", "sync", "sleep"]
