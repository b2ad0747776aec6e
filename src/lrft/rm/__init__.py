"""Reward-model training: ``lrft train-rm``.

- scalar reward models: Bradley-Terry training of a one-output sequence-classification head on
  preference pairs (:func:`lrft.rm.loss.bradley_terry`), exported as the Hugging Face folder that
  ``lrft train --reward_pretrain`` loads;
- generative reward models (judges): supervised training of a causal LM on (prompt, response,
  verdict) rows rendered with a judge template (:mod:`lrft.rewards.judge_template`), exported as
  the causal-LM folder that ``lrft train --grm_pretrain`` judges with.

Both run on any :class:`~lrft.api.TrainBackend` with ``lrft train``'s checkpoints, exact resume
and run ownership of the output folder (:class:`RMTrainer`).
"""

from lrft.rm.build import build_rm_trainer
from lrft.rm.config import RMTrainConfig
from lrft.rm.data import (
    Columns,
    ExampleSet,
    JudgeExample,
    PreferencePair,
    load_judge_examples,
    load_preference_pairs,
)
from lrft.rm.loss import bradley_terry, verdict_cross_entropy
from lrft.rm.objectives import PairObjective, VerdictObjective
from lrft.rm.trainer import RMFitResult, RMTrainer

__all__ = [
    "Columns",
    "ExampleSet",
    "JudgeExample",
    "PairObjective",
    "PreferencePair",
    "RMFitResult",
    "RMTrainConfig",
    "RMTrainer",
    "VerdictObjective",
    "bradley_terry",
    "build_rm_trainer",
    "load_judge_examples",
    "load_preference_pairs",
    "verdict_cross_entropy",
]
