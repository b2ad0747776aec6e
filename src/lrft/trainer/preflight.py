"""The checks a training run passes before any process group starts: its settings against the
files and models they name (a resume's checkpoint, the reward's sources, a distillation teacher
or a process reward model and its tokenizer, the LoRA targets, the environment and its tools,
the families of the models whose rows are packed). Each raises ``ConfigError`` naming the
setting."""

from __future__ import annotations

from transformers import AutoConfig, AutoTokenizer

from lrft.api.errors import ConfigError
from lrft.backends.train.lora import check_lora_model
from lrft.config import TrainConfig
from lrft.config.inputs import check_inputs
from lrft.config.problems import Problems, reporting
from lrft.data.formatting import check_system_role
from lrft.data.sources import check_split
from lrft.models.packed_attention import check_packing_support
from lrft.run import checkpoint as ckpt
from lrft.run.resume import check_resume_settings, checkpoint_to_resume
from lrft.trainer.episodes import environment_setup
from lrft.trainer.process_rewards import check_process_reward_model
from lrft.trainer.rewards import check_reward_settings
from lrft.trainer.teacher import check_teacher_settings


def check_before_start(config: TrainConfig) -> None:
    """Every check of a complete config (its model and prompts named) that reads this machine,
    each run whatever the others find; their problems are raised together (or reported to the
    active gatherer, :mod:`lrft.config.problems`). The checks that load a model run only once
    every model folder was found to be one: a missing folder's name would otherwise be taken
    for a Hub id."""
    with reporting() as problems:
        models_ok = check_inputs(config, problems)
        problems.check(_check_resume, config)
        problems.check(check_reward_settings, config)
        _check_splits(config, problems)
        if models_ok:
            problems.check_each(
                (
                    _check_system_prompt,
                    check_teacher_settings,
                    check_process_reward_model,
                    _check_lora,
                    _check_environment,
                    _check_packing,
                ),
                config,
            )


def _check_splits(config: TrainConfig, problems: Problems) -> None:
    """The splits training and evaluation read exist in their sources."""
    for source in config.prompt_sources:
        problems.check(_check_split, "prompt_split", source, config.prompt_split)
    if config.eval_dataset is not None:
        problems.check(_check_split, "eval_split", config.eval_dataset, config.eval_split)
    elif config.eval_split is not None and config.prompt_sources:
        problems.check(_check_split, "eval_split", config.prompt_sources[0], config.eval_split)


def _check_split(flag: str, source: str, split: str | None) -> None:
    try:
        check_split(source, split)
    except ConfigError as error:
        named = f"--{flag} {split!r}" if split is not None else f"--prompt_data {source!r}"
        hint = "" if split is not None else " (--prompt_split picks another)"
        raise ConfigError(f"{named}: {error}{hint}") from error


def _check_resume(config: TrainConfig) -> None:
    """A resume's settings against its checkpoint's, once the demo or preset filled them in."""
    if not config.load_checkpoint:
        return
    latest = checkpoint_to_resume(config)
    if latest is not None:
        check_resume_settings(ckpt.read_manifest(latest), config, latest)


def _check_system_prompt(config: TrainConfig) -> None:
    """The model's chat template takes the system prompt."""
    if config.system_prompt is None:
        return
    assert config.pretrain is not None
    tokenizer = AutoTokenizer.from_pretrained(config.pretrain)
    if tokenizer.chat_template:  # else a processor's template, checked when prompts are made
        check_system_role(config.system_prompt, tokenizer)


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


def _check_packing(config: TrainConfig) -> None:
    """Every model the trainer packs rows for (actor and reference, a distillation teacher,
    critic, reward models, a process reward model) is of a family lrft packs, and the heads of
    the actor, the teacher and the critic split over the sequence-parallel group (reward models
    score each rank's own rows, unsplit)."""
    if not config.packing_samples:
        return
    assert config.pretrain is not None
    models = [("pretrain", config.pretrain, config.sequence_parallel_size)]
    if config.uses_critic:
        critic = config.critic_pretrain if config.critic_pretrain is not None else config.pretrain
        models.append(("critic_pretrain", critic, config.sequence_parallel_size))
    if config.teacher_pretrain is not None:
        # scored by the same packed (and split) forward as the reference model
        models.append(("teacher_pretrain", config.teacher_pretrain, config.sequence_parallel_size))
    models += [("reward_pretrain", path, 1) for path in config.reward_pretrain]
    if config.prm_pretrain is not None:
        models.append(("prm_pretrain", config.prm_pretrain, 1))
    for flag, path, split in models:
        try:
            check_packing_support(AutoConfig.from_pretrained(path), split)
        except ConfigError as error:
            raise ConfigError(f"{flag} {path!r}: {error}") from error
