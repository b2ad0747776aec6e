"""Offline W&B runs read back with wandb's own reader (``wandb leet inspect --json``), which
decodes the run's ``.wandb`` transaction log record by record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

OFFLINE_ENV = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true"}
"""Environment of a test that logs to W&B: local files only, never a login or a request."""


def offline_runs(wandb_dir: Path) -> list[Path]:
    """The offline run folders under ``wandb_dir`` (``.../wandb``), oldest first."""
    return sorted(wandb_dir.glob("offline-run-*"))


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    """Every record of the offline run in ``run_dir``, in the order wandb wrote them."""
    env = {**os.environ, **OFFLINE_ENV}
    done = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def history(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Logged rows by step, without wandb's own ``_``-prefixed bookkeeping keys."""
    rows: dict[int, dict[str, Any]] = {}
    for record in records:
        if record["type"] == "history":
            item = record["history"]["item"]
            step = int(record["history"]["step"]["num"])
            rows[step] = {k: v for k, v in item.items() if not k.startswith("_")}
    return rows


def only(records: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The payload of the one record of type ``kind``."""
    found = [record[kind] for record in records if record["type"] == kind]
    assert len(found) == 1, f"{len(found)} {kind!r} records"
    payload: dict[str, Any] = found[0]
    return payload
