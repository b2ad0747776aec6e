"""Checkpoints: an atomic directory with a JSON manifest, rotation, and Hugging Face export.

Layout: ``<root>/global_step<k>/`` holding ``manifest.json``, ``model/`` (what
``TrainableModel.save`` writes for the actor: model, optimizer, scheduler) and, when a critic is
trained, ``critic/`` (the same for the critic). A checkpoint is written under
``<root>/.tmp-global_step<k>`` and renamed when every rank has finished, so a directory named
``global_step<k>`` is always complete; an interrupted write leaves only a temporary directory,
which :func:`latest_checkpoint` ignores and the next write of that step removes.
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
    """Write checkpoint ``step`` atomically, then keep only the newest ``max_keep``. Collective.

    ``manifest`` holds rank 0's JSON values; every rank's RNG state is gathered into it.
    """
    final = root / f"global_step{step}"
    temporary = root / f".tmp-global_step{step}"
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
        for old in checkpoint_steps(root)[:-max_keep]:
            shutil.rmtree(root / f"global_step{old}", ignore_errors=True)
    _barrier()
    return final


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
