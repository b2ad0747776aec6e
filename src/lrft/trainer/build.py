"""Build a ready :class:`RLTrainer` from a :class:`TrainConfig`: models, backend, engine, data.

Composes only the Protocols' implementations: the ``fsdp2`` TrainBackend, the ``hf`` engine and
``direct`` weight sync. With no ``pretrain`` the built-in demo provides model, data and reward.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from lrft.api.errors import ConfigError
from lrft.api.optim import OptimizerConfig
from lrft.api.protocols import RolloutEngine, TrainBackend
from lrft.api.types import SamplingParams
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.backends.sync.direct import DirectSync
from lrft.backends.train.fsdp2 import FSDP2Backend, FSDP2Config
from lrft.data import PromptDataConfig, PromptDataset, load_prompt_dataset
from lrft.dist import RankInfo, RolloutLayout, init_distributed
from lrft.rewards import MathVerifyReward, PerSampleReward, RewardFn
from lrft.trainer import demo
from lrft.trainer.config import TrainConfig
from lrft.trainer.experience import ExperienceMaker
from lrft.trainer.export import export_hf
from lrft.trainer.trainer import RLTrainer

if TYPE_CHECKING:
    from lrft.backends.train.deepspeed import ZeroStage

ENGINE_SLEEP_LEVEL = 2
"""Training rollouts sleep at level 2: a weight sync always follows and reloads the weights."""


def _hf_engine(pretrain: str, config: TrainConfig) -> RolloutEngine:
    chunk = config.micro_rollout_batch_size * config.n_samples_per_prompt
    engine_config = HFEngineConfig(dtype=torch.float32, max_batch_size=chunk)
    return HFRolloutEngine.from_pretrained(pretrain, config=engine_config)


ENGINES: dict[str, Callable[[str, TrainConfig], RolloutEngine]] = {"hf": _hf_engine}
"""Rollout engines by ``--engine_type``; each entry must be listed in ``ENGINE_MAX_TP``."""


def train_backend(config: TrainConfig) -> TrainBackend:
    """FSDP2 by default; DeepSpeed ZeRO at ``config.zero_stage`` when it is set."""
    if config.zero_stage is None:
        return FSDP2Backend(FSDP2Config(cpu_offload=config.fsdp_cpu_offload))
    # imported here: deepspeed is an optional dependency and lrft never imports it unasked
    from lrft.backends.train.deepspeed import DeepSpeedBackend, DeepSpeedConfig, read_override

    override = (
        {} if config.deepspeed_config is None else read_override(Path(config.deepspeed_config))
    )
    stage = cast("ZeroStage", config.zero_stage)
    return DeepSpeedBackend(DeepSpeedConfig(zero_stage=stage, override=override))


def load_reward(spec: str, reference_key: str | None) -> RewardFn:
    """``math`` or ``module:function``: a function scoring one ``RewardSample``, or a
    ``RewardFn`` object (anything with ``name`` and a batch ``__call__``)."""
    if spec == "math":
        if reference_key is None:
            raise ConfigError("--reward_fn math compares with the reference: set --reference_key")
        return MathVerifyReward()
    module_name, _, attribute = spec.partition(":")
    try:
        target = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ConfigError(f"--reward_fn {spec!r} cannot be imported: {error}") from error
    if isinstance(target, RewardFn):
        return target
    if callable(target):
        return PerSampleReward(name=attribute, score=target)
    raise ConfigError(f"--reward_fn {spec!r} is neither a function nor a RewardFn")


def _data(
    config: TrainConfig, path: str, tokenizer: PreTrainedTokenizerBase, limit: int | None
) -> PromptDataset:
    data = PromptDataConfig(
        prompt_data=path,
        input_key=config.input_key,
        label_key=config.label_key,
        reference_key=config.reference_key,
        apply_chat_template=config.apply_chat_template,
        input_template=config.input_template,
        max_prompt_length=config.prompt_max_len,
        max_samples=limit,
    )
    return load_prompt_dataset(data, tokenizer)


def build_trainer(config: TrainConfig, rank_info: RankInfo | None = None) -> RLTrainer:
    """Start the process group (with the configured collective timeout) and build everything."""
    info = rank_info if rank_info is not None else RankInfo.from_env()
    config.validate_world(info.world_size)
    if config.pretrain is None:
        config = demo.demo_config(config, info.rank)
    assert config.pretrain is not None
    assert config.prompt_data is not None
    init_distributed(info, timeout=timedelta(seconds=config.collective_timeout_s))
    torch.manual_seed(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(config.pretrain)
    train_data = _data(config, config.prompt_data, tokenizer, config.max_samples)
    eval_data = (
        None
        if config.eval_dataset is None
        else _data(config, config.eval_dataset, tokenizer, config.eval_max_samples)
    )
    assert config.reward_fn is not None  # required with pretrain; the demo sets its own
    reward = load_reward(config.reward_fn, config.reference_key)

    backend = train_backend(config)
    model = AutoModelForCausalLM.from_pretrained(config.pretrain, dtype=torch.float32)
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable()  # type: ignore[no-untyped-call]  # unannotated in transformers
    actor = backend.prepare_trainable(
        model,
        optimizer=OptimizerConfig(
            lr=config.actor_learning_rate, weight_decay=config.l2, max_grad_norm=config.max_norm
        ),
    )
    reference = None
    if config.init_kl_coef > 0:
        frozen = AutoModelForCausalLM.from_pretrained(config.pretrain, dtype=torch.float32)
        reference = backend.prepare_frozen(frozen)
    engine = ENGINES[config.engine_type](config.pretrain, config)
    tp_group = None
    if config.engine_tp_size > 1:
        tp_group = (
            RolloutLayout(world_size=info.world_size, tp_size=config.engine_tp_size)
            .build_groups()
            .tp_group
        )
    eos = tokenizer.eos_token_id
    sampling = SamplingParams(
        n=config.n_samples_per_prompt,
        temperature=config.temperature,
        top_p=config.top_p,
        max_new_tokens=config.generate_max_len,
        stop_token_ids=() if eos is None else (int(eos),),
    )
    maker = ExperienceMaker(
        engine=engine,
        decode=lambda ids: str(tokenizer.decode(list(ids), skip_special_tokens=True)),
        reward=reward,
        sampling=sampling,
        estimator=config.advantage_estimator,
        micro_batch_size=config.micro_rollout_batch_size,
        device=backend.device,
        tp_group=tp_group,
        kl_coef=config.init_kl_coef,
        kl_estimator=config.kl_estimator,
        kl_in_reward=not config.use_kl_loss,
        normalize_reward=config.normalize_reward,
    )
    pretrain = config.pretrain

    def export(directory: Path) -> None:
        export_hf(actor, pretrained=pretrain, tokenizer=tokenizer, directory=directory)

    return RLTrainer(
        config=config,
        actor=actor,
        reference=reference,
        engine=engine,
        sync=DirectSync(),
        maker=maker,
        train_data=train_data,
        eval_data=eval_data,
        device=backend.device,
        export=export if config.save_hf_model else None,
        sleep_level=ENGINE_SLEEP_LEVEL if config.enable_engine_sleep else None,
    )
