"""The calculator demo as a training job: ``lrft train --demo calculator``.

The settings the demo brings for whatever the user left at its default (among them the
environment, its tool and the episode budget, which the demo's model was warmed up for), and
the config that trains the shipped model on the 3-digit prompt files written here.
"""

from __future__ import annotations

import json
from pathlib import Path

from lrft.api.errors import ConfigError
from lrft.config import TrainConfig
from lrft.demos.task import AdditionTask, with_task_files

ASSETS_DIR = Path(__file__).resolve().parent / "assets"
"""The warmed-up model and its tokenizer (``scripts/make_calculator_demo.py`` made them; its
report is ``demo.json`` there)."""

CALCULATOR_TASK = AdditionTask(digits=3, num_train=6000, num_eval=500, seed=0)
"""The problems: sums of two 3-digit numbers; the warm-up saw only the training ones."""

CALCULATOR_DEMO_REWARD = "lrft.demos:exact_answer"
"""The stated integer must be the sum (the last turn's text, after the tool's output)."""

CALCULATOR_DEMO_SETTINGS: dict[str, object] = {
    "environment": "tool_calls",
    "tools": "calculator",
    # The warm-up wrote the calls and read the tool's output as plain text, no chat template.
    "environment_options": json.dumps({"chat_template": False}),
    "max_turns": 2,
    "max_episode_tokens": 64,
    "generate_max_len": 40,
    "n_samples_per_prompt": 8,
    "rollout_batch_size": 32,
    "micro_rollout_batch_size": 16,
    "train_batch_size": 128,
    "micro_train_batch_size": 32,
    "actor_learning_rate": 3e-4,
    "temperature": 1.0,
    "max_steps": 20,
    "eval_steps": 10,
    "eval_max_samples": 200,
    "enable_engine_sleep": True,
}
"""What ``lrft train --demo calculator`` uses, unless the command line says otherwise."""


def calculator_demo_config(config: TrainConfig, rank: int) -> TrainConfig:
    """``config`` with the calculator demo's model folder and prompt files (written here, per
    rank: :func:`lrft.demos.task.write_task_files`)."""
    if not (ASSETS_DIR / "config.json").is_file():
        raise ConfigError(
            f"the calculator demo model is missing from {ASSETS_DIR}; make it with "
            "scripts/make_calculator_demo.py (docs/multi-turn.md), or give --pretrain"
        )
    data_dir = Path(config.save_path) / "demo_data" / "calculator"
    return with_task_files(
        config,
        model=ASSETS_DIR,
        task=CALCULATOR_TASK,
        data_dir=data_dir,
        reward=CALCULATOR_DEMO_REWARD,
        rank=rank,
    )
