"""Checkpoints: an atomic directory with a JSON manifest, rotation, and Hugging Face export.

Layout: ``<root>/global_step<k>/`` holding ``manifest.json``, ``model/`` (what
``TrainableModel.save`` writes for the actor: model, optimizer, scheduler) and, when a critic is
trained, ``critic/`` (the same for the critic). A checkpoint is written under
``<root>/.tmp-global_step<k>`` and renamed when every rank has finished, so a directory named
``global_step<k>`` is always complete; an interrupted write leaves only a temporary directory,
which :func:`latest_checkpoint` ignores and the next write of that step removes.

The manifest's ``run_id`` names the run that wrote a checkpoint (a resumed run keeps its
checkpoint's id). Rotation removes only checkpoints of the writing run, and never the one just
written; a step that another run's checkpoint already holds is refused, never replaced.
"""

from __future__ import annotations

import base64
import json
import random
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lrft.api.errors import ConfigError
from lrft.api.protocols import TrainableModel

MANIFEST = "manifest.json"
MODEL_DIR = "model"
CRITIC_DIR = "critic"
FORMAT_VERSION = 1
_NAME = re.compile(r"global_step(\d+)")
_ENTRY = re.compile(r"(\.tmp-|\.old-)?global_step\d+")
RUN_ID = "run_id"
"""The manifest key naming the run that wrote a checkpoint."""
_UNREADABLE = object()  # the owner of a checkpoint whose manifest cannot be read: nobody's


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def rng_state() -> dict[str, Any]:
    """This process's torch (CPU, and CUDA when present) and Python RNG states, JSON-ready."""
    state: dict[str, Any] = {
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
        "python": json.loads(json.dumps(random.getstate())),
    }
    if torch.cuda.is_available():
        state["cuda"] = base64.b64encode(torch.cuda.get_rng_state().numpy().tobytes()).decode()
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    raw = base64.b64decode(state["torch"])
    torch.set_rng_state(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        cuda = base64.b64decode(state["cuda"])
        torch.cuda.set_rng_state(torch.frombuffer(bytearray(cuda), dtype=torch.uint8))


def checkpoint_steps(root: Path) -> list[int]:
    """Steps of the complete checkpoints under ``root``, ascending."""
    if not root.is_dir():
        return []
    steps = []
    for path in root.iterdir():
        match = _NAME.fullmatch(path.name)
        if match and (path / MANIFEST).is_file():
            steps.append(int(match.group(1)))
    return sorted(steps)


def checkpoint_entries(root: Path) -> list[Path]:
    """Every checkpoint directory under ``root``: complete ones and the temporary names of an
    unfinished write or replacement, by step."""
    if not root.is_dir():
        return []
    entries = [path for path in root.iterdir() if _ENTRY.fullmatch(path.name)]
    return sorted(entries, key=lambda path: (int(path.name.rsplit("step", 1)[1]), path.name))


def checkpoint_owner(directory: Path) -> object:
    """The ``run_id`` in ``directory``'s manifest (``None`` when it records none: a checkpoint
    of an older lrft, or one written without an id); a sentinel matching no run when the
    manifest cannot be read."""
    try:
        return read_manifest(directory).get(RUN_ID)
    except (OSError, ValueError):
        return _UNREADABLE


def latest_checkpoint(root: Path) -> Path | None:
    steps = checkpoint_steps(root)
    return root / f"global_step{steps[-1]}" if steps else None


def save_checkpoint(
    root: Path,
    *,
    step: int,
    actor: TrainableModel,
    manifest: Mapping[str, Any],
    max_keep: int,
    critic: TrainableModel | None = None,
) -> Path:
    """Write checkpoint ``step`` atomically, then keep only the newest ``max_keep`` of this
    run's. Collective.

    ``manifest`` holds rank 0's JSON values; every rank's RNG state is gathered into it. Its
    ``run_id`` (absent: ``None``) says which run this is: rotation removes only that run's older
    checkpoints, never the one just written nor another run's. Raises ``ConfigError``, on every
    rank and before writing anything, when another run's checkpoint already holds ``step``.
    """
    final = root / f"global_step{step}"
    temporary = root / f".tmp-global_step{step}"
    owner = manifest.get(RUN_ID)
    # Every rank reads it (the folder is shared: every rank writes its shards into it), so all
    # raise alike instead of leaving the others waiting in the barrier below.
    if (final / MANIFEST).is_file() and checkpoint_owner(final) != owner:
        raise ConfigError(
            f"checkpoint {final} was written by run {checkpoint_owner(final)!r}, not by this "
            f"run {owner!r}: lrft never replaces another run's checkpoint; give this run a "
            "fresh --ckpt_path"
        )
    if _rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(temporary, ignore_errors=True)
        temporary.mkdir()
    _barrier()
    actor.save(temporary / MODEL_DIR)
    if critic is not None:
        critic.save(temporary / CRITIC_DIR)
    states: list[Any] = [rng_state()]
    if dist.is_initialized() and dist.get_world_size() > 1:
        states = [None] * dist.get_world_size()
        dist.all_gather_object(states, rng_state())
    if _rank() == 0:
        record = {**manifest, "step": step, "format": FORMAT_VERSION, "rng": states}
        (temporary / MANIFEST).write_text(json.dumps(record, indent=1, sort_keys=True))
    _barrier()
    if _rank() == 0:
        stale = root / f".old-global_step{step}"
        if final.exists():  # the same step written again (a resumed run): replace it whole
            final.rename(stale)
        temporary.rename(final)
        shutil.rmtree(stale, ignore_errors=True)
        _rotate(root, keep=final, owner=owner, max_keep=max_keep)
    _barrier()
    return final


def _rotate(root: Path, *, keep: Path, owner: object, max_keep: int) -> None:
    """Remove ``owner``'s oldest checkpoints beyond ``max_keep``, ``keep`` counted and kept."""
    others = [
        root / f"global_step{step}"
        for step in checkpoint_steps(root)
        if root / f"global_step{step}" != keep
    ]
    ours = [path for path in others if checkpoint_owner(path) == owner]
    for old in ours[: max(0, len(ours) - (max_keep - 1))]:
        shutil.rmtree(old, ignore_errors=True)


def read_manifest(directory: Path) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads((directory / MANIFEST).read_text())
    return manifest


def load_checkpoint(
    directory: Path, actor: TrainableModel, critic: TrainableModel | None = None
) -> dict[str, Any]:
    """Restore the actor (and the critic) from ``directory`` and this rank's RNG state; return
    the manifest. Raises ``ConfigError`` when the checkpoint has a critic and the run has none,
    or the other way round: resuming would silently drop or invent one."""
    manifest = read_manifest(directory)
    saved = (directory / CRITIC_DIR).is_dir()
    if saved != (critic is not None):
        raise ConfigError(
            f"checkpoint {directory} {'holds a' if saved else 'has no'} critic, but this run "
            f"trains {'none' if saved else 'one'} (advantage_estimator decides): resume with the "
            "estimator the checkpoint was written with"
        )
    actor.load(directory / MODEL_DIR)
    if critic is not None:
        critic.load(directory / CRITIC_DIR)
    states = manifest["rng"]
    rank = _rank()
    if rank < len(states):
        restore_rng_state(states[rank])
    return manifest
