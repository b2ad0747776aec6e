"""A run's outputs: which files under ``save_path`` and the checkpoint folder are lrft's, which
run they belong to, and the check made before a run writes any.

A run owns its folders. ``SAVE_PATH/run.json`` names the run whose outputs ``SAVE_PATH`` holds
by its ``run_id``, the id its checkpoints' manifests carry (a resumed run keeps the id of the
checkpoint it resumed from). lrft's own outputs are exactly what :func:`find_outputs` lists:
``run.json``, ``metrics.jsonl``, the TensorBoard event files, ``curves.png``, the trajectory
files, the exported ``hf_model/`` (and a LoRA run's ``lora_adapter/``), wandb's ``wandb/`` folder, and the checkpoint directories
(with the temporary names an unfinished write leaves). The demo's and presets' prompt files
(``demo_data/``, ``preset_data/``) are inputs that every run writes again, byte for byte, and
any other file is the user's: neither counts, and neither is ever removed.

:func:`claim_outputs` enforces, before a run writes anything:

- a new run (no ``load_checkpoint``) needs folders that hold none of those outputs, or
  ``overwrite_output``, which removes exactly them (and says which);
- a resumed run needs its checkpoint and ``SAVE_PATH``'s outputs to be one run's, and, when
  there is no checkpoint to resume from, a ``SAVE_PATH`` holding no outputs.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Protocol

import torch.distributed as dist

import lrft
from lrft.api.errors import ConfigError
from lrft.dist import broadcast_object
from lrft.run.checkpoint import checkpoint_entries, checkpoint_owner, latest_checkpoint
from lrft.run.export import HF_MODEL_DIR, LORA_ADAPTER_DIR
from lrft.run.metrics import CURVES_FILE, METRICS_FILE, TENSORBOARD_DIR
from lrft.run.wandb_metrics import FILES_DIR as WANDB_FILES_DIR

TRAJECTORY_DIR = "trajectories"
"""Where a run's per-step sample records go (:mod:`lrft.trainer.trajectories` writes them)."""
RUN_FILE = "run.json"
_SAVE_PATH_ENTRIES = (
    RUN_FILE,
    METRICS_FILE,
    f"{METRICS_FILE}.tmp",  # a resume's rewrite of the metrics, interrupted
    CURVES_FILE,
    HF_MODEL_DIR,
    f".tmp-{HF_MODEL_DIR}",
    LORA_ADAPTER_DIR,
    f".tmp-{LORA_ADAPTER_DIR}",
    WANDB_FILES_DIR,
)
_FOLDER_FILES = (
    (TENSORBOARD_DIR, re.compile(r"events\.out\.tfevents\..+")),
    (TRAJECTORY_DIR, re.compile(r"(\.tmp-)?step_\d+\.jsonl")),
)
_COMPLETE_LOOKING = re.compile(rf"global_step\d+|{HF_MODEL_DIR}|{LORA_ADAPTER_DIR}")
_SHOWN = 3  # entries of one kind a message names before it counts the rest


class RunFolders(Protocol):
    """The settings that say where a run writes and whether it continues or replaces another
    (``lrft train``'s and ``lrft train-rm``'s configs both have them, under these names)."""

    @property
    def save_path(self) -> str: ...

    @property
    def checkpoint_dir(self) -> str: ...

    @property
    def load_checkpoint(self) -> bool: ...

    @property
    def overwrite_output(self) -> bool: ...


def new_run_id() -> str:
    """A fresh run id: 16 hexadecimal characters."""
    return secrets.token_hex(8)


def read_run_id(save_path: Path) -> str | None:
    """The id in ``SAVE_PATH/run.json``; ``None`` when there is none. Raises ``ConfigError``
    when the file does not hold one."""
    path = save_path / RUN_FILE
    if not path.is_file():
        return None
    try:
        run_id = json.loads(path.read_text(encoding="utf-8"))["run_id"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"{path} does not name a run ({error}): it is not lrft's") from error
    return str(run_id)


def write_run_file(save_path: Path, run_id: str) -> Path:
    """Record in ``SAVE_PATH/run.json`` that ``run_id`` owns ``save_path`` (rank 0 only)."""
    save_path.mkdir(parents=True, exist_ok=True)
    path = save_path / RUN_FILE
    temporary = path.with_name(f".{RUN_FILE}.tmp")
    record = {"run_id": run_id, "lrft_version": lrft.__version__}
    temporary.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(temporary, path)
    return path


def own_outputs(save_path: Path, run_id: str | None, *, rank: int) -> str:
    """The run's id on every rank (``run_id``, a resumed run's, or a new one rank 0 draws),
    recorded by rank 0 in ``SAVE_PATH/run.json``. Collective when a process group exists."""
    chosen = run_id if run_id is not None else new_run_id()
    if dist.is_initialized() and dist.get_world_size() > 1:
        chosen = broadcast_object(chosen if rank == 0 else None, src=0)
    if rank == 0:
        write_run_file(save_path, chosen)
    return chosen


def _label(path: Path, save_path: Path) -> str:
    return str(path.relative_to(save_path)) if path.is_relative_to(save_path) else str(path)


def _checkpoints_label(save_path: Path, checkpoint_dir: Path) -> str:
    return f"{_label(checkpoint_dir, save_path)}/"


def find_outputs(save_path: Path, checkpoint_dir: Path) -> dict[str, list[Path]]:
    """lrft's outputs under ``save_path`` and ``checkpoint_dir``, keyed by how a message names
    them (``metrics.jsonl``, ``tensorboard/``, ``checkpoints/``, ...)."""
    found: dict[str, list[Path]] = {}
    for name in _SAVE_PATH_ENTRIES:
        path = save_path / name
        if path.exists() or path.is_symlink():
            found[name] = [path]
    for folder, pattern in _FOLDER_FILES:
        directory = save_path / folder
        if directory.is_dir():
            files = sorted(p for p in directory.iterdir() if pattern.fullmatch(p.name))
            if files:
                found[f"{folder}/"] = files
    checkpoints = checkpoint_entries(checkpoint_dir)
    if checkpoints:
        found[_checkpoints_label(save_path, checkpoint_dir)] = checkpoints
    return found


def describe(found: dict[str, list[Path]]) -> str:
    """``found`` in a few words: ``metrics.jsonl, checkpoints/ (global_step8, ...)``."""
    parts = []
    for label, paths in found.items():
        if len(paths) == 1 and paths[0].name == label:
            parts.append(label)
            continue
        names = [path.name for path in paths[:_SHOWN]]
        if len(paths) > _SHOWN:
            names.append(f"{len(paths) - _SHOWN} more")
        parts.append(f"{label} ({', '.join(names)})")
    return ", ".join(parts)


def _discard(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        if _COMPLETE_LOOKING.fullmatch(path.name):
            # Hidden first: a half-removed checkpoint or export must never look complete.
            hidden = path.with_name(f".tmp-{path.name}")
            shutil.rmtree(hidden, ignore_errors=True)
            path.rename(hidden)
            path = hidden
        shutil.rmtree(path)
    else:
        path.unlink()


def remove_outputs(found: dict[str, list[Path]], save_path: Path, checkpoint_dir: Path) -> None:
    """Remove exactly the outputs in ``found``, then those of their folders left empty."""
    for paths in found.values():
        for path in paths:
            _discard(path)
    for folder in (save_path / TENSORBOARD_DIR, save_path / TRAJECTORY_DIR, checkpoint_dir):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def _occupied(config: RunFolders, found: dict[str, list[Path]]) -> str:
    save_path, checkpoints = Path(config.save_path), Path(config.checkpoint_dir)
    fresh = (
        "--save_path" if checkpoints.is_relative_to(save_path) else "--save_path and --ckpt_path"
    )
    resumable = (
        "" if latest_checkpoint(checkpoints) else " (it left no checkpoint to continue from)"
    )
    return (
        f"save_path {save_path} already holds the outputs of another run: {describe(found)}. "
        f"A new run there would mix with them. To continue that run from its latest checkpoint, "
        f"add --load_checkpoint{resumable}; to start a new run, give a fresh {fresh}; to "
        "replace that run, add --overwrite_output (it removes exactly these lrft outputs and "
        "leaves every other file)"
    )


def refusal(config: RunFolders) -> str | None:
    """Why this run may not write into its folders (see the module docstring); ``None`` when it
    may. Reads files only."""
    save_path, checkpoints = Path(config.save_path), Path(config.checkpoint_dir)
    found = find_outputs(save_path, checkpoints)
    if not config.load_checkpoint:
        return _occupied(config, found) if found else None
    found.pop(_checkpoints_label(save_path, checkpoints), None)  # the other outputs remain
    latest = latest_checkpoint(checkpoints)
    if latest is None:
        if not found:
            return None
        return (
            f"load_checkpoint found no checkpoint under {checkpoints} to continue from, but "
            f"save_path {save_path} holds the outputs of an earlier run: {describe(found)}. "
            "A run from step 0 would mix with them: give a fresh --save_path, or drop "
            "--load_checkpoint and add --overwrite_output to replace them"
        )
    owner = checkpoint_owner(latest)
    if owner is None:
        return None  # written before checkpoints named their run: nothing to compare with
    if not isinstance(owner, str):
        return f"checkpoint {latest} has a manifest that cannot be read: it cannot be resumed"
    marker = read_run_id(save_path)
    if marker == owner or (marker is None and not found):
        return None
    whose = "no recorded run" if marker is None else f"run {marker}"
    return (
        f"checkpoint {latest} is run {owner}'s, but save_path {save_path} holds the outputs of "
        f"{whose}: {describe(found)}. Resuming there would mix two runs: give the resumed "
        "run a fresh --save_path"
    )


def claim_outputs(config: RunFolders, *, rank: int) -> str | None:
    """Refuse, on every rank, a run that would mix its outputs with another's (``ConfigError``
    from :func:`refusal`); with ``overwrite_output``, remove the outputs found (rank 0). Returns,
    on rank 0, what was removed, for the run to say.

    Without a process group (``lrft train`` calls it before starting one), every rank reads the
    same folders and nothing is written there before every rank has joined the group, so all
    ranks reach the same verdict; with one, rank 0 decides and tells the others.
    """
    grouped = dist.is_initialized() and dist.get_world_size() > 1
    save_path, checkpoints = Path(config.save_path), Path(config.checkpoint_dir)
    if config.overwrite_output:  # a new run by construction: nothing to refuse
        removed = None
        if rank == 0:
            found = find_outputs(save_path, checkpoints)
            remove_outputs(found, save_path, checkpoints)
            if found:
                removed = f"overwrite_output: removed {describe(found)} from {save_path}"
        if grouped:
            dist.barrier()  # removed before any rank writes
        return removed
    error = None
    if rank == 0 or not grouped:
        try:
            error = refusal(config)
        except ConfigError as unreadable:  # told to every rank like any other verdict
            error = str(unreadable)
    if grouped:
        error = broadcast_object((error,), src=0)[0]
    if error is not None:
        raise ConfigError(error)
    return None
