"""The checks a training run passes before any process group starts: its settings against the
files and models they name (a resume's checkpoint, the reward's sources, a distillation teacher or a process
reward model and its tokenizer, the LoRA targets, the environment and its tools). Each raises ``ConfigError`` naming the setting."""

from __future__ import annotations

from transformers import AutoConfig, AutoTokenizer

from lrft.backends.train.lora import check_lora_model
from lrft.config import TrainConfig
from lrft.run import checkpoint as ckpt
from lrft.run.resume import check_resume_settings, checkpoint_to_resume
from lrft.trainer.episodes import environment_setup
from lrft.trainer.process_rewards import check_process_reward_settings
from lrft.trainer.rewards import check_reward_settings
from lrft.trainer.teacher import check_teacher_settings


def check_before_start(config: TrainConfig) -> None:
    """Every check of a complete config (its model and prompts named) that reads this machine."""
    config.validate_inputs()
    _check_resume(config)
    check_reward_settings(config)
    check_teacher_settings(config)
    check_process_reward_settings(config)
    _check_lora(config)
    _check_environment(config)


def _check_resume(config: TrainConfig) -> None:
    """A resume's settings against its checkpoint's, once the demo or preset filled them in."""
    if not config.load_checkpoint:
        return
    latest = checkpoint_to_resume(config)
    if latest is not None:
        check_resume_settings(ckpt.read_manifest(latest), config, latest)


def _check_lora(config: TrainConfig) -> None:
    """The adapters ``config`` asks for fit its model (their target modules exist and are
    linear, peft can wrap it), checked on a weightless copy."""
    if config.lora is None:
        return
    assert config.pretrain is not None
    check_lora_model(AutoConfig.from_pretrained(config.pretrain), config.lora)


def _check_environment(config: TrainConfig) -> None:
    """The environment, its options and its tools, made once with the model's tokenizer (a bad
    option or a template that cannot render the environment's roles is a ``ConfigError``
    naming it)."""
    if config.environment is None:
        return
    assert config.pretrain is not None
    tokenizer = AutoTokenizer.from_pretrained(config.pretrain)
    environment_setup(
        config.environment, config.tools, config.environment_option_values(), tokenizer
    )
