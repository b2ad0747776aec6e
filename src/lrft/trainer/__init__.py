"""The RL trainer: experience making, replay buffer, colocated phase lifecycle, checkpoints.

- :class:`TrainConfig`: every setting of ``lrft train``, validated before any process starts;
- :class:`ExperienceMaker`: rollouts, actor/reference logprobs, rewards, advantages (one
  normalisation stage, DP-global statistics);
- :class:`ReplayBuffer`, :class:`PolicyUpdate`: shuffled micro-batches and the policy epochs;
- :func:`load_critic`, :class:`CriticUpdate`: PPO's critic (value-based estimators such as gae),
  its values and its clipped-value-loss epochs;
- :class:`Colocation`: the memory phases of one iteration, memory logged at each boundary;
- :class:`RLTrainer`: the loop, evaluation, JSONL metrics, checkpoints and Hugging Face export;
- :func:`build_trainer`: all of it from a config (fsdp2 + hf engine + direct sync).
"""

from lrft.config import TrainConfig, supported_estimators
from lrft.models.critic import load_critic
from lrft.run.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from lrft.trainer.colocation import PHASES, Colocation
from lrft.trainer.critic import CriticUpdate
from lrft.trainer.experience import ExperienceBatch, ExperienceMaker
from lrft.trainer.policy import PolicyUpdate
from lrft.trainer.replay import ReplayBuffer
from lrft.trainer.sequences import Sequences, pack
from lrft.trainer.trainer import FitResult, RLTrainer

__all__ = [
    "PHASES",
    "Colocation",
    "CriticUpdate",
    "ExperienceBatch",
    "ExperienceMaker",
    "FitResult",
    "PolicyUpdate",
    "RLTrainer",
    "ReplayBuffer",
    "Sequences",
    "TrainConfig",
    "latest_checkpoint",
    "load_checkpoint",
    "load_critic",
    "pack",
    "save_checkpoint",
    "supported_estimators",
]
