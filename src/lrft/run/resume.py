"""What a resumed run may change: its checkpoint's settings against the current ones.

A checkpoint's manifest holds the whole :class:`TrainConfig` of the run that wrote it. A resume
(``load_checkpoint``) must match it in every setting that decides what the run computes: the
model, data and rewards, the algorithm and its hyperparameters, the batch geometry, sampling,
the engine, the training backend and the seed. Those settings are read when a run starts and
their effects live in the checkpoint (its sampler position, optimizer state, RNG states), so a
change would be ignored in part or silently mixed with the old run. :data:`RESUMABLE_SETTINGS`
are the exceptions: where the run writes, how long it runs, how often it checkpoints, evaluates
and logs, and the memory and speed settings, which change how a step is computed but not its
result (up to floating-point summation order).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from lrft.api.errors import ConfigError

if TYPE_CHECKING:
    from attrs import AttrsInstance

    from lrft.config import TrainConfig

RESUMABLE_SETTINGS = frozenset(
    {
        # where the run reads and writes (the prompts' content is checked by the manifest's
        # data fingerprint, not by the path)
        "save_path",
        "ckpt_path",
        "cache_dir",
        "prompt_data",
        "load_checkpoint",
        "overwrite_output",
        # how long it runs
        "max_steps",
        "num_episodes",
        # checkpoints, evaluation, logging and outputs
        "save_steps",
        "max_ckpt_num",
        "eval_dataset",
        "eval_max_samples",
        "eval_steps",
        "save_hf_model",
        "use_tensorboard",
        "use_wandb",
        "wandb_project",
        "wandb_org",
        "wandb_group",
        "wandb_run_name",
        "progress_bar",
        "save_trajectories",
        "save_trajectories_steps",
        # operations: timeouts, and where the reward services answer (their URLs may carry
        # credentials, which change without the reward changing)
        "collective_timeout_s",
        "remote_rm_url",
        "remote_rm_timeout_s",
        "remote_rm_max_attempts",
        "remote_rm_auth_env",
        # how a service is spoken to: its format, and how its POSTs are cut and overlapped
        "remote_rm_protocol",
        "remote_rm_batch_size",
        "remote_rm_max_concurrency",
        # where the teacher service answers, and how it is spoken to (its scores are the
        # teacher's wherever it runs)
        "teacher_url",
        "teacher_protocol",
        "teacher_timeout_s",
        "teacher_max_attempts",
        "teacher_auth_env",
        # memory placement and speed, documented as not changing the result
        "enable_engine_sleep",
        "engine_mem_util",
        "hf_decode",
        "gradient_checkpointing",
        "fsdp_cpu_offload",
        "fsdp_reshard_after_forward",
        "fsdp_defer_gradient_sync",
        "adam_offload",
        "max_tokens_per_micro_batch",
        "packing_samples",
        "sequence_parallel_size",
    }
)
"""The settings a resumed run may change; every other setting must equal the checkpoint's."""

_UNSHOWN = frozenset({"remote_rm_url", "teacher_url"})
"""Changed settings named without their values: they may hold credentials."""


def _json(value: object) -> object:
    # The manifest stores JSON: tuples come back as lists.
    return json.loads(json.dumps(value))


def settings_changes(
    saved: Mapping[str, Any],
    config: AttrsInstance,
    *,
    resumable: frozenset[str] = RESUMABLE_SETTINGS,
) -> tuple[list[str], list[str]]:
    """The settings of ``config`` (a :class:`TrainConfig`, or another command's attrs config
    with its own ``resumable`` names) that differ from ``saved`` (a manifest's config), as
    ``name saved -> now``: those that block a resume, and those a resume may change.

    A setting the manifest lacks (written by an older lrft) is compared as its default.
    """
    blocking: list[str] = []
    allowed: list[str] = []
    for field in attrs.fields(type(config)):
        now = _json(getattr(config, field.name))
        if field.name in saved:
            before = saved[field.name]
        elif isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]  # attrs.Factory is a class at run time
            continue  # a default computed from other settings: nothing to compare with
        else:
            before = _json(field.default)
        if before == now:
            continue
        if field.name in _UNSHOWN:
            change = f"{field.name} (changed)"
        else:
            change = f"{field.name} {before!r} -> {now!r}"
        (allowed if field.name in resumable else blocking).append(change)
    return blocking, allowed


def check_resume_settings(
    manifest: Mapping[str, Any],
    config: AttrsInstance,
    directory: Path,
    *,
    resumable: frozenset[str] = RESUMABLE_SETTINGS,
    command: str = "lrft train",
    docs: str = "docs/trainer.md",
) -> list[str]:
    """Raise ``ConfigError`` naming every setting of ``config`` that differs from the one
    checkpoint ``directory`` (its ``manifest``) was written with, where a resume may not change
    it (``resumable`` names those it may); return the changes it may make, for the run to
    report. ``command`` and ``docs`` name what wrote such checkpoints and where the rules are."""
    saved = manifest.get("config")
    if not isinstance(saved, Mapping):
        raise ConfigError(
            f"checkpoint {directory} records no configuration, so it cannot be checked against "
            f"this run's: resume only checkpoints written by {command}"
        )
    blocking, allowed = settings_changes(saved, config, resumable=resumable)
    if blocking:
        raise ConfigError(
            f"checkpoint {directory} was written with other settings, which a resume may not "
            f"change (checkpoint -> this run): {'; '.join(blocking)}. Resume with the "
            "checkpoint's settings, or start a new run in a fresh --save_path. A resume may "
            "change only the run's length, its output paths, its checkpoint, evaluation and "
            f"logging settings, and the memory and speed settings ({docs})"
        )
    return allowed


def checkpoint_to_resume(config: TrainConfig) -> Path | None:
    """The checkpoint a ``load_checkpoint`` run resumes from: the one ``ckpt_path`` names (it must
    be complete), else the newest complete one in ``checkpoint_dir``; ``None`` when the run starts
    from step 0, which only a run whose checkpoint folder was not given may do (a first run of a
    job resumed with the same command). Raises ``ConfigError`` for a named checkpoint that is not
    a complete one or has later checkpoints beside it (they would be overwritten), and for a
    given ``ckpt_path`` holding none."""
    from lrft.run import checkpoint as ckpt

    if config.resume_from is not None:
        named = Path(config.resume_from)
        if not (named / ckpt.MANIFEST).is_file():
            raise ConfigError(
                f"ckpt_path {config.ckpt_path!r} names a checkpoint that is not a complete lrft "
                f"checkpoint (no {ckpt.MANIFEST}); the complete ones in {config.checkpoint_dir} "
                f"are at steps {ckpt.checkpoint_steps(Path(config.checkpoint_dir)) or 'none'}"
            )
        step = int(named.name.removeprefix("global_step"))
        newer = [k for k in ckpt.checkpoint_steps(Path(config.checkpoint_dir)) if k > step]
        if newer:
            # The resumed run would write its own checkpoints at those steps, over these.
            raise ConfigError(
                f"ckpt_path {config.ckpt_path!r} names step {step}, but the same folder holds "
                f"later checkpoints at steps {newer}, which the resumed run would overwrite as "
                "it reaches them: copy the checkpoint into a folder of its own and give that as "
                "--ckpt_path (with a fresh --save_path), or remove the later ones yourself"
            )
        return named
    latest = ckpt.latest_checkpoint(Path(config.checkpoint_dir))
    if latest is None and config.ckpt_path is not None:
        raise ConfigError(
            f"ckpt_path {config.ckpt_path!r} holds no complete lrft checkpoint "
            f"(global_step<k>/{ckpt.MANIFEST}) to resume from: give a checkpoint folder or the "
            "folder holding them (a LightRFT checkpoint, _actor/, cannot be resumed by lrft). "
            "Without --ckpt_path, --load_checkpoint starts from step 0 when no checkpoint exists "
            "yet"
        )
    return latest


def check_schedule(saved: object, now: dict[str, Any], checkpoint: Path) -> None:
    """Raises ``ConfigError`` when the learning-rate schedule a checkpoint was written with
    (``saved``; ``None`` for a checkpoint that records none) differs from the resumed run's
    (``now``): a run's length is resumable, but a warm-up or decay spans the whole run, so
    another length would bend the curve where the run resumes."""
    if saved is not None and saved != now:
        raise ConfigError(
            f"checkpoint {checkpoint} was written with the learning-rate schedule {saved}, "
            f"and this run's length makes it {now}: a warm-up or decay spans the whole run, "
            "so resume with the checkpoint's max_steps and num_episodes"
        )
