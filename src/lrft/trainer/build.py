"""The composition root: every part of an :class:`RLTrainer` built from a :class:`TrainConfig`.

:func:`build_trainer` checks the run's folders, settings and files before any process group
starts, then builds, in order: the prompts, the train backend and its models (actor, reference,
a distillation teacher, critic), the reward, the rollout stack (engine, TP group, experience maker: shared with
``lrft eval``, :func:`rollout_stack`), the rollout of the configured mode
(:mod:`lrft.trainer.rollout`), the phases, the updates and the run's records. The trainer only
runs them. The Protocols' implementations come from :mod:`lrft.trainer.components`. A run with
no model of its own gets the demo's or a preset's first (:mod:`lrft.demos.apply`).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import attrs
import torch
from torch.distributed import ProcessGroup
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from lrft.api.errors import ConfigError
from lrft.api.optim import SchedulerConfig
from lrft.api.protocols import FrozenModel, RolloutEngine, TrainableModel, TrainBackend
from lrft.api.types import ModelPart, SamplingParams
from lrft.backends.train.lora import AdaptersDisabled, apply_lora
from lrft.config import TrainConfig
from lrft.data import DistributedPromptSampler, MediaProcessor
from lrft.dist import PhaseWatch, RankInfo, RolloutLayout, init_distributed
from lrft.models.media import (
    freeze_audio_tower,
    freeze_vision_tower,
    keep_vision_tower_running,
    load_generative_model,
)
from lrft.rewards import RewardFn
from lrft.run.export import LORA_ADAPTER_DIR, export_hf, export_lora_adapter
from lrft.run.outputs import claim_outputs
from lrft.trainer.colocation import Colocation
from lrft.trainer.components import engine_memory_share, rollout_engine, train_backend, weight_sync
from lrft.trainer.critic import CriticUpdate, load_critic
from lrft.trainer.episodes import EpisodeRunner
from lrft.trainer.experience import Decode, ExperienceMaker
from lrft.trainer.plugins import import_plugins
from lrft.trainer.policy import PolicyUpdate, needs_old_logprob_pass
from lrft.trainer.preflight import check_before_start
from lrft.trainer.process_rewards import process_rewards
from lrft.trainer.prompts import eval_prompts, load_prompts, planned_iterations
from lrft.trainer.records import RunRecords
from lrft.trainer.replay import ReplayBuffer
from lrft.trainer.rewards import build_reward, data_labels
from lrft.trainer.rollout import (
    EpisodeRollout,
    RefillRollout,
    Rollout,
    RolloutParts,
    RolloutSeeds,
    SingleTurnRollout,
)
from lrft.trainer.teacher import load_teacher_model, make_teacher
from lrft.trainer.trainer import RLTrainer, TrainerParts

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


@attrs.frozen(kw_only=True, eq=False)
class RolloutStack:
    """What generates and scores: the engine serving the policy on this rank, its TP group
    (``None`` at TP 1), and the experience maker around them and the reward."""

    engine: RolloutEngine
    tp_group: ProcessGroup | None
    maker: ExperienceMaker


def rollout_stack(
    config: TrainConfig,
    info: RankInfo,
    *,
    pretrain: str,
    reward: RewardFn,
    tokenizer: PreTrainedTokenizerBase,
    device: torch.device,
) -> RolloutStack:
    """The engine serving ``pretrain``, its TP group and the experience maker, as ``lrft
    train`` and ``lrft eval`` both build them. Collective over the default group."""
    engine = rollout_engine(pretrain, config, info)
    tp_group = None
    if config.engine_tp_size > 1:
        layout = RolloutLayout(world_size=info.world_size, tp_size=config.engine_tp_size)
        tp_group = layout.build_groups().tp_group
    maker = experience_maker(
        config,
        engine=engine,
        decode=lambda ids: str(tokenizer.decode(list(ids), skip_special_tokens=True)),
        reward=reward,
        device=device,
        tp_group=tp_group,
        eos_token_id=tokenizer.eos_token_id,
    )
    return RolloutStack(engine=engine, tp_group=tp_group, maker=maker)


def build_trainer(config: TrainConfig, rank_info: RankInfo | None = None) -> RLTrainer:
    """Check the run's folders, settings and files, then start the process group (with the
    configured collective timeout) and its phase watch, and build everything. ``config`` names
    its model and prompts (``lrft train`` fills in the demo's or a preset's first)."""
    info = rank_info if rank_info is not None else RankInfo.from_env()
    import_plugins(config.plugins)
    config.validate_world(info.world_size)
    if config.engine_type == "vllm":
        engine_memory_share(config, info)  # its ConfigError before any process group starts
    removed = claim_outputs(config, rank=info.rank)
    if removed is not None:
        print(removed, flush=True)
    if config.pretrain is None or config.prompt_data is None:
        raise ConfigError(
            f"pretrain {config.pretrain!r} and prompt_data {config.prompt_data!r}: the trainer "
            "needs both (lrft train fills them in from the demo or a preset first: "
            "lrft.demos.apply.apply_demo_or_preset)"
        )
    check_before_start(config)
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
    teacher_model = (
        load_teacher_model(config, backend) if config.teacher_pretrain is not None else None
    )
    reward = build_reward(config, backend, data_labels([train_data, eval_data]))
    process = process_rewards(config, backend, tokenizer)
    critic, critic_offload = (
        build_critic(config, backend, schedule)
        if config.uses_critic
        else (None, frozenset[ModelPart]())
    )
    stack = rollout_stack(
        config,
        info,
        pretrain=config.pretrain,
        reward=reward,
        tokenizer=tokenizer,
        device=backend.device,
    )
    if info.rank == 0:
        print(
            f"backends: train {backend.name}, engine {stack.engine.name}, weight sync "
            f"{config.weight_sync}",
            flush=True,
        )
    colocation = Colocation(
        engine=stack.engine,
        actor=actor,
        reference=reference,
        sync=weight_sync(config),
        device=backend.device,
        sleep_level=ENGINE_SLEEP_LEVEL if config.enable_engine_sleep else None,
        # A backend that moves no parameters (FSDP2 cpu_offload) keeps them on the host already;
        # a LoRA reference is the actor: nothing of its own to move.
        offload_reference=config.enable_engine_sleep
        and ModelPart.PARAMETERS in backend.capabilities.offload
        and config.lora is None,
        offload_optimizer=config.adam_offload,
        critic=critic,
        critic_offload=critic_offload,
        watch=watch,
        teacher=teacher_model,
        # like the reference: out of the engine's way except during its own pass
        offload_teacher=config.enable_engine_sleep
        and ModelPart.PARAMETERS in backend.capabilities.offload,
    )
    sampler = DistributedPromptSampler(
        num_samples=len(train_data),
        global_batch_size=config.rollout_batch_size,
        rank=info.rank,
        world_size=info.world_size,
        seed=config.seed,
    )
    parts = RolloutParts(
        colocation=colocation,
        maker=stack.maker,
        data=train_data,
        sampler=sampler,
        seeds=RolloutSeeds(seed=config.seed, rank=info.rank, tp_size=config.engine_tp_size),
        n=config.n_samples_per_prompt,
        task_reward=not config.no_task_reward,
        process=process,
    )
    pretrain = config.pretrain

    def export(directory: Path) -> None:
        export_hf(actor, pretrained=pretrain, tokenizer=tokenizer, directory=directory)
        if config.lora is not None:  # the adapters too, as a peft folder beside the merged one
            export_lora_adapter(
                actor, pretrained=pretrain, directory=directory.with_name(LORA_ADAPTER_DIR)
            )

    per_rank_train = config.train_batch_size // info.world_size
    return RLTrainer(
        config,
        TrainerParts(
            actor=actor,
            critic=critic,
            colocation=colocation,
            rollout=_rollout(config, parts, tokenizer, watch),
            maker=stack.maker,
            sampler=sampler,
            train_data=train_data,
            eval_data=eval_data,
            update=PolicyUpdate.from_config(config, world_size=info.world_size),
            critic_update=CriticUpdate(
                micro_batch_size=config.micro_train_batch_size,
                accumulation=per_rank_train // config.micro_train_batch_size,
                epochs=config.max_epochs,
                value_clip=config.value_clip_range,
                max_tokens_per_micro_batch=config.max_tokens_per_micro_batch,
            ),
            buffer=ReplayBuffer(seed=config.seed),
            old_logprob_pass=needs_old_logprob_pass(config, actor.module),
            records=RunRecords.for_run(config, info.rank),
            watch=watch,
            export=export if config.save_hf_model else None,
            device=backend.device,
            teacher=make_teacher(config, teacher_model, stack.maker.logprobs),
        ),
    )


def _rollout(
    config: TrainConfig,
    parts: RolloutParts,
    tokenizer: PreTrainedTokenizerBase,
    watch: PhaseWatch,
) -> Rollout:
    """The rollout of the configured mode: episodes of an environment, dynamic sampling's
    refill, or one response per sample."""
    budget = config.episode_budget()
    if config.environment is not None and budget is not None:
        runner = EpisodeRunner.build(
            environment=config.environment,
            tools=config.tools,
            options=config.environment_option_values(),
            tokenizer=tokenizer,
            budget=budget,
            generate=parts.maker.generate_requests,
            device=parts.maker.device,
        )
        return EpisodeRollout(parts, runner)
    if config.dynamic_sampling:
        return RefillRollout(parts, max_rounds=config.generate_rounds, watch=watch)
    return SingleTurnRollout(parts)
