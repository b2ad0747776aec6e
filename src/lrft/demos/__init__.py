"""The built-in demo: ``lrft train`` with no ``--pretrain`` trains a tiny model on a verifiable
task with its rule reward, all made in-repo and shipped with the package.

Read top-down: the task, tokenizer, model and reward import nothing else of the trainer; the
settings build the demo's :class:`~lrft.config.TrainConfig`.

- :mod:`lrft.demos.task`: two-digit addition (``"47+38="`` -> ``"85"``), seeded disjoint
  training and held-out problem sets (:class:`AdditionTask`), exact answer checking and
  accuracy, JSONL prompt files for :mod:`lrft.data` (``input`` and ``answer`` columns);
- :mod:`lrft.demos.tokenizer`: a byte-level tokenizer with no merges (one token per byte);
- :mod:`lrft.demos.model`: the shipped model folder (:data:`ASSETS_DIR`), a tiny Qwen2
  warmed up by ``scripts/make_demo_model.py`` on demonstrations that often drop carries, so that
  RL with the exact-answer reward has clear headroom (``scripts/demo_headroom.py`` measures it);
- :mod:`lrft.demos.reward`: :class:`AdditionReward`, the rule reward as a ``RewardFn``,
  and :func:`exact_answer`, the same rule per sample as the demo's ``reward_fn``;
- :mod:`lrft.demos.settings`: the settings the demo brings (:data:`DEMO_SETTINGS`,
  :func:`demo_settings`) and :func:`demo_config`, which writes the prompt files and points the
  config at them and at the model.

``lrft train --demo vision`` runs :mod:`lrft.demos.vision` instead: a tiny Qwen2-VL
counting shapes in images (imported when chosen: it draws with Pillow).
"""

from lrft.demos.model import ASSETS_DIR, load_model, load_tokenizer
from lrft.demos.reward import AdditionReward, exact_answer
from lrft.demos.settings import (
    DEMO_CRITIC_SETTINGS,
    DEMO_LORA_SETTINGS,
    DEMO_REWARD,
    DEMO_SETTINGS,
    chosen_demo_config,
    demo_config,
    demo_settings,
)
from lrft.demos.task import (
    INPUT_KEY,
    REFERENCE_KEY,
    AdditionTask,
    Problem,
    accuracy,
    extract_answer,
    is_correct,
    problem_rows,
    sloppy_sum,
    write_jsonl,
)

__all__ = [
    "ASSETS_DIR",
    "DEMO_CRITIC_SETTINGS",
    "DEMO_LORA_SETTINGS",
    "DEMO_REWARD",
    "DEMO_SETTINGS",
    "INPUT_KEY",
    "REFERENCE_KEY",
    "AdditionReward",
    "AdditionTask",
    "Problem",
    "accuracy",
    "chosen_demo_config",
    "demo_config",
    "demo_settings",
    "exact_answer",
    "extract_answer",
    "is_correct",
    "load_model",
    "load_tokenizer",
    "problem_rows",
    "sloppy_sum",
    "write_jsonl",
]
