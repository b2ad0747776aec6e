"""Build a ready :class:`RLTrainer` from a :class:`TrainConfig`: models, backend, engine, data.

Composes only the Protocols' implementations, each chosen by its registered name
(:mod:`lrft.backends.registry`): lrft's ``fsdp2`` or ``deepspeed`` TrainBackend, ``hf`` or
``vllm`` engine and ``direct`` weight sync are built from their own settings, an installed
package's from its spec (:mod:`lrft.trainer.plugins`). With no ``pretrain`` the built-in demo
provides model, data and reward; a ``preset`` provides whichever of them the user left unset
(:mod:`lrft.presets`).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.distributed import ProcessGroup
from transformers import AutoConfig, AutoTokenizer

from lrft import demos as demo
from lrft.api.errors import ConfigError
from lrft.api.optim import SchedulerConfig
from lrft.api.protocols import FrozenModel, RolloutEngine, TrainableModel, TrainBackend
from lrft.api.types import ModelPart, SamplingParams
from lrft.backends.train.lora import AdaptersDisabled, apply_lora, check_lora_model
from lrft.config import TrainConfig
from lrft.data import MediaProcessor
from lrft.dist import PhaseWatch, RankInfo, RolloutLayout, init_distributed
from lrft.models.media import (
    freeze_audio_tower,
    freeze_vision_tower,
    keep_vision_tower_running,
    load_generative_model,
)
from lrft.presets import preset_config
from lrft.rewards import RewardFn
from lrft.run import checkpoint as ckpt
from lrft.run.export import LORA_ADAPTER_DIR, export_hf, export_lora_adapter
from lrft.run.outputs import claim_outputs
from lrft.run.resume import check_resume_settings, checkpoint_to_resume
from lrft.trainer.components import engine_memory_share, rollout_engine, train_backend, weight_sync
from lrft.trainer.critic import load_critic
from lrft.trainer.episodes import EpisodeRollout, environment_setup
from lrft.trainer.experience import Decode, ExperienceMaker
from lrft.trainer.plugins import import_plugins
from lrft.trainer.prompts import eval_prompts, load_prompts, planned_iterations
from lrft.trainer.rewards import build_reward, check_reward_settings, data_labels
from lrft.trainer.trainer import RLTrainer

if TYPE_CHECKING:
    pass

ENGINE_SLEEP_LEVEL = 2
"""Training rollouts sleep at level 2: a weight sync always follows and reloads the weights."""


def build_critic(
    config: TrainConfig, backend: TrainBackend, schedule: SchedulerConfig | None = None
) -> tuple[TrainableModel, frozenset[ModelPart]]:
    """The critic wrapped by ``backend`` (from ``critic_pretrain``, else ``pretrain``), and the
    parts of it that live on the host outside its phases. Collective (``prepare_trainable``)."""
    path = config.critic_pretrain if config.critic_pretrain is not None else config.pretrain
    assert path is not None
    model = load_critic(path, seed=config.seed, attn_implementation=config.attn_implementation)
    keep_vision_tower_running(model)  # as the actor's (see causal_lm)
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable()  # type: ignore[no-untyped-call]  # unannotated in transformers
    critic = backend.prepare_trainable(
        model, optimizer=config.optimizer_config(config.critic_lr), scheduler=schedule
    )
    parts: set[ModelPart] = set()
    if config.enable_engine_sleep:
        # Like the reference model: out of the engine's way except during its own phases.
        parts |= {ModelPart.PARAMETERS, ModelPart.OPTIMIZER}
    if config.adam_offload:
        parts.add(ModelPart.OPTIMIZER)
    # A backend that can move nothing (FSDP2 cpu_offload) keeps every part on the host already.
    return critic, frozenset(parts) & backend.capabilities.offload


def _policy_model(config: TrainConfig) -> torch.nn.Module:
    """The actor's initial model, in fp32, prepared as ``config`` says (gradient
    checkpointing; a frozen vision tower)."""
    model = causal_lm(config)
    if config.freeze_vision_tower:
        freeze_vision_tower(model)
    if config.freeze_audio_tower:
        freeze_audio_tower(model)
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable()  # type: ignore[operator]  # a transformers model, typed as a plain Module
    return model


def rollout_sampling(config: TrainConfig, eos_token_id: int | None) -> SamplingParams:
    """How training rollouts sample; the engine returns its own logprobs when TIS reads them."""
    return SamplingParams(
        n=config.n_samples_per_prompt,
        temperature=config.temperature,
        top_p=config.top_p,
        max_new_tokens=config.generate_max_len,
        stop_token_ids=() if eos_token_id is None else (int(eos_token_id),),
        return_logprobs=config.use_tis,
    )


def experience_maker(
    config: TrainConfig,
    *,
    engine: RolloutEngine,
    decode: Decode,
    reward: RewardFn,
    device: torch.device,
    tp_group: ProcessGroup | None,
    eos_token_id: int | None,
) -> ExperienceMaker:
    """The experience maker that ``config`` describes, around already-built components."""
    return ExperienceMaker(
        engine=engine,
        decode=decode,
        reward=reward,
        sampling=rollout_sampling(config, eos_token_id),
        estimator=config.advantage_estimator,
        micro_batch_size=config.micro_rollout_batch_size,
        device=device,
        tp_group=tp_group,
        kl_coef=config.init_kl_coef,
        kl_estimator=config.kl_estimator,
        kl_in_reward=not config.use_kl_loss,
        normalize_reward=config.normalize_reward,
        advantage_params=config.advantage_params,
        first_token_temperature=config.first_token_temperature,
        overlong_buffer_len=config.overlong_buffer_len,
        overlong_penalty_factor=config.overlong_factor,
        reward_clip=config.reward_clip,
        advantage_clip=config.advantage_clip,
    )


def causal_lm(config: TrainConfig) -> torch.nn.Module:
    """``pretrain``'s generative model (a causal LM, or a vision-language model's
    image-text-to-text class) in fp32 with the configured attention kernel (actor and
    reference). A vision-language model runs its vision tower in every forward, also over a
    micro-batch without images, so that its sharded ranks' collectives match
    (:func:`lrft.models.media.keep_vision_tower_running`)."""
    assert config.pretrain is not None
    model = load_generative_model(
        config.pretrain, dtype=torch.float32, attn_implementation=config.attn_implementation
    )
    keep_vision_tower_running(model)
    return model


def _check_outputs(config: TrainConfig, rank: int) -> None:
    """Whether this run may write into its folders (:func:`claim_outputs`, which with
    ``overwrite_output`` clears them), before the demo or a preset writes its prompt files."""
    removed = claim_outputs(config, rank=rank)
    if removed is not None:
        print(removed, flush=True)


def _check_resume(config: TrainConfig) -> None:
    """A resume's settings against its checkpoint's, once the demo or preset filled them in."""
    if not config.load_checkpoint:
        return
    latest = checkpoint_to_resume(config)
    if latest is not None:
        check_resume_settings(ckpt.read_manifest(latest), config, latest)


def build_trainer(config: TrainConfig, rank_info: RankInfo | None = None) -> RLTrainer:
    """Check the run's folders, settings and files, then start the process group (with the
    configured collective timeout) and its phase watch, and build everything."""
    info = rank_info if rank_info is not None else RankInfo.from_env()
    import_plugins(config.plugins)
    config.validate_world(info.world_size)
    if config.engine_type == "vllm":
        engine_memory_share(config, info)  # its ConfigError before any process group starts
    _check_outputs(config, info.rank)
    if config.preset is not None:
        config = preset_config(config, info.rank)
    elif config.pretrain is None:
        config = demo.chosen_demo_config(config, info.rank)
    elif config.demo != "addition":
        raise ConfigError(
            f"demo {config.demo!r} runs only when no pretrain is given (it brings its own "
            f"model and data), but pretrain is {config.pretrain!r}"
        )
    assert config.pretrain is not None
    assert config.prompt_data is not None
    config.validate_inputs()
    _check_resume(config)
    check_reward_settings(config)
    _check_lora(config)
    _check_environment(config)
    init_distributed(info, timeout=timedelta(seconds=config.collective_timeout_s))
    watch = PhaseWatch.for_default_group(config.collective_timeout_s)
    watch.start()
    try:
        with watch.phase("build"):
            return _build(config, info, watch)
    except BaseException:
        watch.close(failed=True)
        raise


def _build(config: TrainConfig, info: RankInfo, watch: PhaseWatch) -> RLTrainer:
    """Everything ``build_trainer`` makes once the process group is up. Collective."""
    assert config.pretrain is not None
    assert config.prompt_data is not None
    torch.manual_seed(config.seed)
    # A vision-language model's prompts are formatted by its own processor (which holds its
    # tokenizer): the images' placeholders and their expansion are the model's.
    processor = (
        None
        if config.images_key is None and config.audios_key is None
        else MediaProcessor.from_pretrained(config.pretrain)
    )
    tokenizer = (
        AutoTokenizer.from_pretrained(config.pretrain) if processor is None else processor.tokenizer
    )
    train_data = load_prompts(
        config,
        config.prompt_sources,
        tokenizer,
        limit=config.max_samples,
        split=config.prompt_split,
        probs=config.prompt_data_probs,
        processor=processor,
    )
    eval_data = eval_prompts(config, tokenizer, processor)
    schedule = config.scheduler_config(planned_iterations(config, len(train_data), info))

    backend = train_backend(config, info)
    model = _policy_model(config)
    # LoRA: the adapters are part of the model the backend wraps
    trained = model if config.lora is None else apply_lora(model, config.lora)
    actor = backend.prepare_trainable(
        trained,
        optimizer=config.optimizer_config(config.actor_learning_rate),
        scheduler=schedule,
    )
    reference: FrozenModel | None = None
    if config.init_kl_coef > 0 and config.lora is not None:
        reference = AdaptersDisabled(actor)  # the actor's own base: no second copy of it
    elif config.init_kl_coef > 0:
        reference = backend.prepare_frozen(causal_lm(config))
    reward = build_reward(config, backend, data_labels([train_data, eval_data]))
    critic, critic_offload = (
        build_critic(config, backend, schedule)
        if config.uses_critic
        else (None, frozenset[ModelPart]())
    )
    engine = rollout_engine(config.pretrain, config, info)
    sync = weight_sync(config)
    if info.rank == 0:
        print(
            f"backends: train {backend.name}, engine {engine.name}, weight sync "
            f"{config.weight_sync}",
            flush=True,
        )
    tp_group = None
    if config.engine_tp_size > 1:
        tp_group = (
            RolloutLayout(world_size=info.world_size, tp_size=config.engine_tp_size)
            .build_groups()
            .tp_group
        )
    maker = experience_maker(
        config,
        engine=engine,
        decode=lambda ids: str(tokenizer.decode(list(ids), skip_special_tokens=True)),
        reward=reward,
        device=backend.device,
        tp_group=tp_group,
        eos_token_id=tokenizer.eos_token_id,
    )
    episodes = None
    budget = config.episode_budget()
    if config.environment is not None and budget is not None:
        episodes = EpisodeRollout.build(
            environment=config.environment,
            tools=config.tools,
            options=config.environment_option_values(),
            tokenizer=tokenizer,
            budget=budget,
            generate=maker.generate_requests,
            device=backend.device,
        )
    pretrain = config.pretrain

    def export(directory: Path) -> None:
        export_hf(actor, pretrained=pretrain, tokenizer=tokenizer, directory=directory)
        if config.lora is not None:  # the adapters too, as a peft folder beside the merged one
            export_lora_adapter(
                actor, pretrained=pretrain, directory=directory.with_name(LORA_ADAPTER_DIR)
            )

    return RLTrainer(
        config=config,
        actor=actor,
        reference=reference,
        engine=engine,
        sync=sync,
        maker=maker,
        train_data=train_data,
        eval_data=eval_data,
        device=backend.device,
        export=export if config.save_hf_model else None,
        sleep_level=ENGINE_SLEEP_LEVEL if config.enable_engine_sleep else None,
        critic=critic,
        critic_offload=critic_offload,
        # A backend that moves no parameters (FSDP2 cpu_offload) keeps them on the host already.
        offload_reference=config.enable_engine_sleep
        and ModelPart.PARAMETERS in backend.capabilities.offload
        and config.lora is None,  # a LoRA reference is the actor: nothing of its own to move
        watch=watch,
        episodes=episodes,
    )


def _check_environment(config: TrainConfig) -> None:
    """The environment, its options and its tools, made once with the model's tokenizer before
    any process group starts (a bad option or a template that cannot render the environment's
    roles is a ``ConfigError`` naming it)."""
    if config.environment is None:
        return
    assert config.pretrain is not None
    tokenizer = AutoTokenizer.from_pretrained(config.pretrain)
    environment_setup(
        config.environment, config.tools, config.environment_option_values(), tokenizer
    )


# --- LoRA -------------------------------------------------------------------------------------


def _check_lora(config: TrainConfig) -> None:
    """The adapters ``config`` asks for fit its model (their target modules exist and are
    linear, peft can wrap it), checked on a weightless copy before any process group starts."""
    if config.lora is None:
        return
    assert config.pretrain is not None
    check_lora_model(AutoConfig.from_pretrained(config.pretrain), config.lora)
