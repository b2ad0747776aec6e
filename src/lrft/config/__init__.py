"""The trainer's settings: :class:`TrainConfig`, one frozen record validated whole before any
process group starts.

Read top-down, each module importing only those above it:

- :mod:`~lrft.config.choices`: the names some settings choose among (engines, the hf
  engine's decoding paths, presets);
- :mod:`~lrft.config.validators`: each field's own rule;
- :mod:`~lrft.config.flag_spec`: what the command line needs to know of a field (its
  ``--help`` group, how its value is read), carried in the field's metadata;
- :mod:`~lrft.config.rollout_fields`, :mod:`~lrft.config.distill_fields` then
  :mod:`~lrft.config.fields`: every field, its default and its meaning (its docstring, also
  its flag's help): those a rollout reads
  (:class:`~lrft.config.rollout_fields.RolloutFields`), those of on-policy distillation and
  process rewards (:class:`~lrft.config.distill_fields.DistillFields`), then the others
  (:class:`~lrft.config.fields.TrainFields`);
- :mod:`~lrft.config.checks`: the rules across fields, and those on the number of ranks;
  :mod:`~lrft.config.inputs`: the rules that read this machine (model folders, files,
  credential variables);
- :mod:`~lrft.config.train_config`: :class:`TrainConfig`, the fields checked at
  construction, with the values derived from them (the defaults of unset settings, the policy
  loss's settings, the engine's memory share).
"""

from lrft.config.checks import (
    ALGORITHM_SETTINGS,
    CRITIC_SETTINGS,
    WANDB_SETTINGS,
    supported_estimators,
    value_based_estimators,
)
from lrft.config.choices import (
    DEMO_NAMES,
    ENGINE_MAX_TP,
    HF_DECODE_PATHS,
    PRESET_NAMES,
    EngineType,
)
from lrft.config.train_config import (
    CPU_KV_CACHE_ENV,
    DEFAULT_CRITIC_LEARNING_RATE,
    DEFAULT_ENGINE_MEM_UTIL,
    DEFAULT_FIRE_TEMPERATURE,
    DEFAULT_GAMMA,
    DEFAULT_LAMBD,
    DEFAULT_MAX_NUM_GEN_BATCHES,
    DEFAULT_OVERLONG_PENALTY_FACTOR,
    DEFAULT_TIS_CAP,
    DEFAULT_VALUE_CLIP,
    TrainConfig,
)
from lrft.extras import VLLM_EXTRA, vllm_available

__all__ = [
    "ALGORITHM_SETTINGS",
    "CPU_KV_CACHE_ENV",
    "CRITIC_SETTINGS",
    "DEFAULT_CRITIC_LEARNING_RATE",
    "DEFAULT_ENGINE_MEM_UTIL",
    "DEFAULT_FIRE_TEMPERATURE",
    "DEFAULT_GAMMA",
    "DEFAULT_LAMBD",
    "DEFAULT_MAX_NUM_GEN_BATCHES",
    "DEFAULT_OVERLONG_PENALTY_FACTOR",
    "DEFAULT_TIS_CAP",
    "DEFAULT_VALUE_CLIP",
    "DEMO_NAMES",
    "ENGINE_MAX_TP",
    "HF_DECODE_PATHS",
    "PRESET_NAMES",
    "VLLM_EXTRA",
    "WANDB_SETTINGS",
    "EngineType",
    "TrainConfig",
    "supported_estimators",
    "value_based_estimators",
    "vllm_available",
]
