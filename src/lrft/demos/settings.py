"""The demo as a training job: ``lrft train`` with no ``--pretrain``.

The settings the demo brings for whatever the user left at its default, and the config that
trains the shipped model (:mod:`lrft.demos.model`) on the task's prompt files
(:mod:`lrft.demos.task`, written here) with the exact-answer reward
(:func:`lrft.demos.reward.exact_answer`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import attrs

from lrft.api.errors import ConfigError
from lrft.config import TrainConfig, value_based_estimators
from lrft.demos.model import ASSETS_DIR
from lrft.demos.task import AdditionTask, with_task_files

DEMO_REWARD = "lrft.demos:exact_answer"
"""The demo's ``reward_fn``."""

DEMO_SETTINGS: dict[str, object] = {
    "n_samples_per_prompt": 8,
    "rollout_batch_size": 32,
    "micro_rollout_batch_size": 16,
    "train_batch_size": 128,
    "micro_train_batch_size": 32,
    "generate_max_len": 5,
    "actor_learning_rate": 3e-4,
    "temperature": 1.0,
    "max_steps": 40,
    "eval_steps": 10,
    "eval_max_samples": 200,
    "enable_engine_sleep": True,
}
"""What ``lrft train`` uses when no model is given, unless the command line says otherwise."""

DEMO_CRITIC_SETTINGS: dict[str, object] = {"critic_learning_rate": 1e-3}
"""Added to :data:`DEMO_SETTINGS` when the estimator trains a critic (gae): its value head starts
from nothing, and at this rate its value loss falls about fourfold within the 40 steps."""


DEMO_LORA_SETTINGS: dict[str, object] = {"actor_learning_rate": 2e-3}
"""Added to :data:`DEMO_SETTINGS` when the actor trains LoRA adapters (``--lora_rank``): rank-8
adapters at the full model's rate (3e-4) reach 0.83 held-out accuracy in the 40 steps, at this
rate 0.92, as the full model does (docs/lora.md)."""


def demo_settings(values: Mapping[str, object]) -> dict[str, object]:
    """The demo's defaults for a command line whose own settings are ``values`` (the vision
    or calculator demo's with ``demo`` ``vision`` or ``calculator``)."""
    if values.get("demo") == "vision":
        from lrft.demos.vision.settings import VISION_DEMO_SETTINGS

        return dict(VISION_DEMO_SETTINGS)
    if values.get("demo") == "calculator":
        from lrft.demos.calculator.settings import CALCULATOR_DEMO_SETTINGS

        return dict(CALCULATOR_DEMO_SETTINGS)
    estimator = values.get(
        "advantage_estimator", attrs.fields_dict(TrainConfig)["advantage_estimator"].default
    )
    settings = dict(DEMO_SETTINGS)
    if isinstance(estimator, str) and estimator in value_based_estimators():
        settings.update(DEMO_CRITIC_SETTINGS)
    if values.get("lora_rank") not in (None, 0):
        settings.update(DEMO_LORA_SETTINGS)
    return settings


def chosen_demo_config(config: TrainConfig, rank: int) -> TrainConfig:
    """``config`` with the files of the demo ``config.demo`` names (see :func:`demo_config`)."""
    if config.demo == "vision":
        # imported here: the vision demo draws its images with Pillow, an optional dependency
        from lrft.demos.vision.settings import vision_demo_config

        return vision_demo_config(config, rank)
    if config.demo == "calculator":
        from lrft.demos.calculator.settings import calculator_demo_config

        return calculator_demo_config(config, rank)
    return demo_config(config, rank)


def demo_config(config: TrainConfig, rank: int) -> TrainConfig:
    """``config`` with the demo's model folder and prompt files (written here, per rank)."""
    if not (ASSETS_DIR / "config.json").is_file():
        raise ConfigError(
            f"the built-in demo model is missing from {ASSETS_DIR}; give --pretrain "
            "(and --prompt_data, --reward_fn) to train another model"
        )
    data_dir = Path(config.save_path) / "demo_data"
    return with_task_files(
        config,
        model=ASSETS_DIR,
        task=AdditionTask(),
        data_dir=data_dir,
        reward=DEMO_REWARD,
        rank=rank,
    )
