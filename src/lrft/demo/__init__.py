"""The embedded demo: a tiny model, a verifiable task and its rule reward, all made in-repo.

- :mod:`lrft.demo.task`: two-digit addition (``"47+38="`` -> ``"85"``), seeded disjoint training
  and held-out problem sets (:class:`AdditionTask`), exact answer checking and accuracy, JSONL
  prompt files for :mod:`lrft.data` (``input`` and ``answer`` columns);
- :mod:`lrft.demo.reward`: :class:`AdditionReward`, the rule reward as a ``RewardFn``;
- :mod:`lrft.demo.tokenizer`: a byte-level tokenizer with no merges (one token per byte);
- :mod:`lrft.demo.model`: the shipped model folder (:data:`ASSETS_DIR`), a tiny Qwen2 warmed up
  by ``scripts/make_demo_model.py`` on demonstrations that often drop carries, so that RL with
  the exact-answer reward has clear headroom (``scripts/demo_headroom.py`` measures it).

Importing this package is light: the model module (and transformers) loads on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lrft.demo.reward import AdditionReward
from lrft.demo.task import (
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

if TYPE_CHECKING:
    from lrft.demo.model import ASSETS_DIR, load_model, load_tokenizer

_MODEL_NAMES = ("ASSETS_DIR", "load_model", "load_tokenizer")


def __getattr__(name: str) -> Any:
    if name in _MODEL_NAMES:
        from lrft.demo import model

        return getattr(model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ASSETS_DIR",
    "INPUT_KEY",
    "REFERENCE_KEY",
    "AdditionReward",
    "AdditionTask",
    "Problem",
    "accuracy",
    "extract_answer",
    "is_correct",
    "load_model",
    "load_tokenizer",
    "problem_rows",
    "sloppy_sum",
    "write_jsonl",
]
