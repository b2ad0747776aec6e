"""The vision demo as a training job: ``lrft train --demo vision``.

The settings the vision demo brings for whatever the user left at its default, and the config
that trains the shipped tiny Qwen2-VL (:mod:`lrft.demos.vision.model`) on prompt files
with images (:mod:`lrft.demos.vision.task`, written here as PNG files beside JSONL rows
whose ``images`` column holds their relative paths) with the exact-answer reward.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import attrs

from lrft.api.errors import ConfigError
from lrft.config import TrainConfig
from lrft.demos.vision.model import ASSETS_DIR
from lrft.demos.vision.task import (
    IMAGES_KEY,
    INPUT_KEY,
    REFERENCE_KEY,
    ShapeCountTask,
    write_problems,
)

VISION_DEMO_REWARD = "lrft.demos:exact_answer"
"""The vision demo's ``reward_fn``: the stated integer must be the count."""

VISION_DEMO_SETTINGS: dict[str, object] = {
    "n_samples_per_prompt": 8,
    "rollout_batch_size": 32,
    "micro_rollout_batch_size": 16,
    "train_batch_size": 128,
    "micro_train_batch_size": 32,
    "generate_max_len": 3,
    "actor_learning_rate": 3e-4,
    "temperature": 1.0,
    "max_steps": 30,
    "eval_steps": 10,
    "eval_max_samples": 200,
    "enable_engine_sleep": True,
}
"""What ``lrft train --demo vision`` uses, unless the command line says otherwise."""


def vision_demo_config(config: TrainConfig, rank: int) -> TrainConfig:
    """``config`` with the vision demo's model folder and prompt files (written here, per rank:
    each rank draws the same images and renames its own copy of the folder into place)."""
    if not (ASSETS_DIR / "config.json").is_file():
        raise ConfigError(
            f"the built-in vision demo model is missing from {ASSETS_DIR}; give --pretrain "
            "(and --prompt_data, --images_key, --reward_fn) to train another model"
        )
    task = ShapeCountTask()
    data_dir = Path(config.save_path) / "demo_data"
    final = data_dir / "vision"
    if not (final / "train.jsonl").is_file() or not (final / "eval.jsonl").is_file():
        staging = data_dir / f".vision.rank{rank}"
        shutil.rmtree(staging, ignore_errors=True)
        write_problems(staging / "train.jsonl", task.train_scenes(), stem="train")
        write_problems(staging / "eval.jsonl", task.eval_scenes(), stem="eval")
        try:
            os.replace(staging, final)  # the same files whichever rank is first
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)  # another rank's copy is in place
    return attrs.evolve(
        config,
        pretrain=str(ASSETS_DIR),
        prompt_data=str(final / "train.jsonl"),
        eval_dataset=str(final / "eval.jsonl"),
        input_key=INPUT_KEY,
        reference_key=REFERENCE_KEY,
        images_key=IMAGES_KEY,
        apply_chat_template=True,
        reward_fn=VISION_DEMO_REWARD,
    )
