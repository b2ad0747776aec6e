"""The benchmark's JSON document and the short table printed after a run."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch
import transformers

import lrft
from lrft.bench.ceilings import device_name
from lrft.bench.flops import FORMULA
from lrft.bench.grpo import PHASE_ROWS

SCHEMA = "lrft.bench/1"
CALL_VARIABLE = "LRFT_BENCH_CALL"
"""The environment variable naming the run (one device call) a document was measured in; a
side-by-side runner sets it for every stage, so a ratio can say whether both sides shared it."""


def call_id() -> str | None:
    return os.environ.get(CALL_VARIABLE) or None


def git_commit() -> str | None:
    """The checkout's commit (with ``+dirty`` when files differ), or ``None`` outside git."""
    root = Path(lrft.__file__).resolve().parents[2]
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{commit}+dirty" if dirty else commit


def environment(device: torch.device, world_size: int) -> dict[str, Any]:
    return {
        "lrft": lrft.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cuda": torch.version.cuda,
        "device_type": device.type,
        "device_name": device_name(device),
        "world_size": world_size,
        "git_commit": git_commit(),
        "call": call_id(),
        "flops_formula": FORMULA,
    }


def write_json(document: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    temporary.replace(path)


def _row(label: str, value: str) -> str:
    return f"  {label:<34} {value}"


def _fraction(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def table(document: dict[str, Any]) -> str:
    """A few lines per part: what a reader compares first."""
    env = document["environment"]
    ceilings = document["ceilings"]
    lines = [
        f"lrft bench {document['mode']} on workload {document['workload']['name']}: "
        f"{env['device_name']} x {env['world_size']}, torch {env['torch']}, "
        f"transformers {env['transformers']}",
        _row(
            "matmul ceiling",
            f"{ceilings['matmul_tflops']:.4g} TFLOP/s ({ceilings['matmul_dtype']})",
        ),
    ]
    grpo = document.get("grpo")
    if grpo is not None:
        lines.append(
            f"grpo: {grpo['samples_per_step']} samples/step, median of steps "
            f"{grpo['steady_steps'][0]}-{grpo['steady_steps'][-1]}"
        )
        lines.append(_row("seconds per step", f"{grpo['step_seconds_median']:.3f}"))
        lines.append(_row("samples per second", f"{grpo['samples_per_s']:.2f}"))
        phases = grpo["phases_seconds_median"]
        for label, key in PHASE_ROWS:
            if key in phases:
                share = phases[key] / grpo["step_seconds_median"]
                lines.append(_row(f"  {label}", f"{phases[key]:.3f} s ({100 * share:.0f}%)"))
        lines.append(_row("rollout tokens/s", f"{grpo['rollout_tokens_per_s']:.0f}"))
        lines.append(_row("training tokens/s", f"{grpo['train_tokens_per_s']:.0f}"))
        lines.append(_row("training MFU", _fraction(grpo["train_mfu"])))
        ragged = grpo.get("ragged")
        if ragged is not None:
            lines.append(
                _row(
                    "ragged responses",
                    f"{ragged['response_tokens_mean']:.0f} tokens on average "
                    f"({ragged['min_tokens']}-{ragged['max_tokens']})",
                )
            )
            lines.append(
                _row(
                    "  generate over ideal",
                    f"{ragged['generate_over_ideal']:.2f}x (full batch "
                    f"{ragged['full_batch_tokens_per_s']:.0f} tokens/s)",
                )
            )
    train = document.get("train_mfu")
    if train is not None and "packed" in train:
        lines.extend(_ragged_train_lines(train))
    elif train is not None:
        lines.append(
            f"train-mfu: {train['sequences_per_step']} sequences of "
            f"{train['tokens_per_sequence']} tokens per optimizer step"
        )
        lines.append(_row("seconds per step", f"{train['step_seconds_median']:.3f}"))
        lines.append(_row("training tokens/s", f"{train['train_tokens_per_s']:.0f}"))
        lines.append(_row("TFLOP/s per device", f"{train['achieved_tflops_per_device']:.4g}"))
        lines.append(_row("MFU", _fraction(train["train_mfu"])))
    sync = document.get("sync")
    if sync is not None:
        lines.append(
            f"sync: {sync['bytes'] / 2**20:.1f} MiB ({sync['engine_dtype']}) in {sync['buckets']} bucket(s)"
        )
        gather = sync["fraction_of_all_gather"]
        for name in ("verified", "unverified", "gather_only"):
            versus = (
                f"{_fraction(sync['fraction_of_device_copy'][name])} of copy, "
                f"{_fraction(sync['fraction_of_cast_copy'][name])} of cast copy"
            )
            if gather is not None:
                versus += f", {_fraction(gather[name])} of all-gather"
            lines.append(
                _row(
                    f"  {name.replace('_', ' ')}",
                    f"{sync['seconds_median'][name] * 1e3:.2f} ms, {sync['GBps'][name]:.1f} GB/s "
                    f"({versus})",
                )
            )
        lines.append(_row("device copy ceiling", f"{sync['device_copy_GBps']:.1f} GB/s"))
        lines.append(
            _row(
                f"cast copy ceiling ({sync['trainer_dtype']} to {sync['engine_dtype']})",
                f"{sync['cast_copy_seconds'] * 1e3:.2f} ms",
            )
        )
        if sync["all_gather_bus_GBps"] is not None:
            lines.append(_row("all-gather bus ceiling", f"{sync['all_gather_bus_GBps']:.1f} GB/s"))
    sleep = document.get("sleep")
    if sleep is not None:
        lines.append(f"sleep: engine weights {sleep['bytes'] / 2**20:.1f} MiB")
        for level in (1, 2):
            part = sleep[f"level{level}"]
            lines.append(
                _row(
                    f"  level {level}",
                    f"freed {part['freed_bytes'] / 2**20:.1f} MiB, sleep "
                    f"{part['sleep_seconds_median'] * 1e3:.2f} ms, wake "
                    f"{part['wake_seconds_median'] * 1e3:.2f} ms",
                )
            )
        if sleep["host_to_device_pinned_GBps"] is not None:
            lines.append(
                _row(
                    "  level 1 wake vs pinned H2D",
                    f"{sleep['level1']['wake_GBps']:.1f} of "
                    f"{sleep['host_to_device_pinned_GBps']:.1f} GB/s "
                    f"({_fraction(sleep['level1']['fraction_of_host_to_device'])})",
                )
            )
    return "\n".join(lines)


def _ragged_train_lines(train: dict[str, Any]) -> list[str]:
    """The ragged training part (:mod:`lrft.bench.train_packing`): padded and packed."""
    lengths = train["response_tokens"]
    lines = [
        f"train-mfu, ragged: {train['sequences_per_step']} sequences per optimizer step, "
        f"responses of {lengths['min']}-{lengths['max']} tokens, padding "
        f"{_fraction(train['padding_fraction'])} of the padded forwards' tokens"
    ]
    for name in ("padded", "packed"):
        side = train[name]
        lines.append(
            _row(
                f"{name} tokens/s",
                f"{side['train_tokens_per_s']:.0f} ({side['step_seconds_median']:.3f} s per step, "
                f"MFU {_fraction(side['train_mfu'])})",
            )
        )
    lines.append(_row("packed over padded", f"{train['packed_speedup']:.2f}x"))
    return lines
