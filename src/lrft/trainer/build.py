"""The composition root: every part of an :class:`RLTrainer` built from a :class:`TrainConfig`.

:func:`build_trainer` checks the run's folders, settings and files before any process group
starts, then builds, in order: the prompts, the train backend and its models (actor, reference,
a distillation teacher, critic), the reward and process rewards, the rollout stack (engine, TP
group, experience maker: shared with ``lrft eval``, :mod:`lrft.trainer.rollout_stack`), the
rollout of the configured mode
(:mod:`lrft.trainer.rollout`), the phases, the updates and the run's records. The trainer only
runs them. The Protocols' implementations come from :mod:`lrft.trainer.components`. A run with
no model of its own gets the demo's or a preset's first (:mod:`lrft.demos.apply`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import cast

import attrs
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from lrft.api.errors import ConfigError
from lrft.api.optim import SchedulerConfig
from lrft.api.protocols import FrozenModel, RolloutEngine, TrainableModel, TrainBackend
from lrft.api.types import ModelPart
from lrft.backends.registry import engine_facts, import_plugins
from lrft.backends.train.lora import AdaptersDisabled, apply_lora
from lrft.config import TrainConfig
from lrft.data import DistributedPromptSampler, MediaProcessor, PromptDataset
from lrft.dist import PhaseWatch, RankInfo, SplitGroups, init_distributed
from lrft.models.critic import load_critic
from lrft.models.media import (
    freeze_audio_tower,
    freeze_vision_tower,
    keep_vision_tower_running,
    load_generative_model,
)
from lrft.models.packed_attention import use_packed_attention
from lrft.run.export import LORA_ADAPTER_DIR, export_hf, export_lora_adapter
from lrft.run.outputs import claim_outputs
from lrft.trainer.async_rollout import AsyncRollout
from lrft.trainer.colocation import Colocation
from lrft.trainer.components import engine_memory_share, train_backend, weight_sync
from lrft.trainer.critic import CriticUpdate
from lrft.trainer.episodes import EpisodeRunner
from lrft.trainer.packing import token_layout
from lrft.trainer.policy import PolicyUpdate, needs_old_logprob_pass
from lrft.trainer.preflight import check_before_start
from lrft.trainer.process_rewards import process_rewards
from lrft.trainer.prompts import eval_prompts, load_prompts, planned_iterations
from lrft.trainer.records import RunRecords
from lrft.trainer.replay import ReplayBuffer
from lrft.trainer.rewards import data_labels, task_reward
from lrft.trainer.rollout import (
    EpisodeRollout,
    RefillRollout,
    Rollout,
    RolloutParts,
    RolloutSeeds,
    SingleTurnRollout,
)
from lrft.trainer.rollout_stack import decoder, experience_maker, rollout_stack
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
    if config.packing_samples:
        use_packed_attention(model)
    if config.gradient_checkpointing:
        enable_activation_checkpointing(model)
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
        enable_activation_checkpointing(model)
    return model


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each layer's activations in the backward pass (``--gradient_checkpointing``).

    transformers 5.2x renamed ``gradient_checkpointing_enable`` to
    ``activation_checkpointing_enable`` (the old name warns on every rank); earlier releases have
    only the old one."""
    enable = (
        getattr(model, "activation_checkpointing_enable", None)
        or model.gradient_checkpointing_enable
    )
    cast("Callable[[], None]", enable)()


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
    if config.packing_samples:
        use_packed_attention(model)
    return model


def build_trainer(
    config: TrainConfig, rank_info: RankInfo | None = None, *, checked: bool = False
) -> RLTrainer:
    """Check the run's folders, settings and files, then start the process group (with the
    configured collective timeout) and its phase watch, and build everything. ``config`` names
    its model and prompts (``lrft train`` fills in the demo's or a preset's first); ``checked``:
    see :func:`prepare_run`."""
    info = rank_info if rank_info is not None else RankInfo.from_env()
    prepare_run(config, info, checked=checked)
    init_distributed(info, timeout=timedelta(seconds=config.collective_timeout_s))
    watch = PhaseWatch.for_default_group(config.collective_timeout_s)
    watch.start()
    try:
        with watch.phase("build"):
            return trainer_after_start(config, info, watch)
    except BaseException:
        watch.close(failed=True)
        raise


def prepare_run(config: TrainConfig, info: RankInfo, *, checked: bool = False) -> None:
    """What a run checks and claims before any process group starts: its plug-ins, the
    settings that depend on the number of ranks, its output folders, its model and prompts.
    ``checked``: ``config`` passed :func:`lrft.trainer.preflight.check_before_start` as it is
    on this rank (``lrft train`` checks a command line whole first), so its files and models
    are not read again."""
    import_plugins(config.plugins)
    config.validate_world(info.world_size)
    facts = engine_facts(config.engine_type)
    if facts is not None and facts.reserves_memory:
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
    if not checked:
        check_before_start(config)


@attrs.frozen(kw_only=True, eq=False)
class PromptSets:
    """The run's tokenizer and its training and held-out prompts."""

    tokenizer: PreTrainedTokenizerBase
    train: PromptDataset
    eval: PromptDataset | None


def prompt_sets(config: TrainConfig) -> PromptSets:
    """The tokenizer (a media model's processor's) and the prompts ``config`` names."""
    assert config.pretrain is not None
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
    return PromptSets(tokenizer=tokenizer, train=train_data, eval=eval_data)


def trainer_after_start(
    config: TrainConfig, info: RankInfo, watch: PhaseWatch, split: SplitGroups | None = None
) -> RLTrainer:
    """Everything ``build_trainer`` makes once the process group is up; collective. ``split``:
    this trainer rank's groups of a split placement (``info`` its place among the trainer
    ranks), which then holds no engine and no reward: the rollout ranks generate and score."""
    assert config.pretrain is not None
    torch.manual_seed(config.seed)
    prompts = prompt_sets(config)
    tokenizer, train_data, eval_data = prompts.tokenizer, prompts.train, prompts.eval
    schedule = config.scheduler_config(planned_iterations(config, len(train_data), info))

    backend = train_backend(config, info)
    layout = token_layout(config, info, backend)
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
    teacher_model = load_teacher_model(config, backend)
    # split: the rollout ranks generate and score; this rank holds neither engine nor reward
    reward = None if split else task_reward(config, backend, data_labels([train_data, eval_data]))
    process = process_rewards(config, backend, tokenizer)
    critic, critic_offload = (
        build_critic(config, backend, schedule)
        if config.uses_critic
        else (None, frozenset[ModelPart]())
    )
    engine: RolloutEngine | None = None
    if split is None:
        stack = rollout_stack(
            config,
            info,
            pretrain=config.pretrain,
            reward=reward,
            tokenizer=tokenizer,
            device=backend.device,
        )
        engine, maker = stack.engine, stack.maker
    else:
        maker = experience_maker(
            config,
            engine=None,
            decode=decoder(tokenizer),
            reward=None,
            device=backend.device,
            tp_group=None,
            eos_token_id=tokenizer.eos_token_id,
        )
    maker.layout = layout
    maker.max_tokens_per_pass = config.max_tokens_per_micro_batch if layout.packed else None
    if info.rank == 0:
        print(
            f"backends: train {backend.name}, engine "
            f"{config.engine_type if engine is None else engine.name}, weight sync "
            f"{config.weight_sync}, placement {config.placement}",
            flush=True,
        )
    colocation = Colocation(
        engine=engine,
        actor=actor,
        reference=reference,
        sync=weight_sync(config, split),
        device=backend.device,
        sleep_level=ENGINE_SLEEP_LEVEL if config.enable_engine_sleep and engine else None,
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
        maker=maker,
        data=train_data,
        sampler=sampler,
        seeds=RolloutSeeds(seed=config.seed, rank=info.rank, tp_size=config.engine_tp_size),
        n=config.n_samples_per_prompt,
        task_reward=not config.no_task_reward,
        process=process,
    )
    rollout: Rollout = (
        _rollout(config, parts, tokenizer, watch)
        if split is None
        else AsyncRollout(
            groups=split,
            colocation=colocation,
            maker=maker,
            data=train_data,
            eval_size=0 if eval_data is None else len(eval_data),
            sampler=sampler,
            n=config.n_samples_per_prompt,
            max_staleness=config.staleness_bound,
            total=config.planned_iterations(sampler.batches_per_epoch),
            eval_every=config.eval_steps,
            watch=watch,
            process=process,
        )
    )
    pretrain = config.pretrain

    def export(directory: Path) -> None:
        export_hf(actor, pretrained=pretrain, tokenizer=tokenizer, directory=directory)
        if config.lora is not None:  # the adapters too, as a peft folder beside the merged one
            export_lora_adapter(
                actor, pretrained=pretrain, directory=directory.with_name(LORA_ADAPTER_DIR)
            )

    # a sequence-parallel group trains one share of the batch
    per_rank_train = config.train_batch_size // (info.world_size // layout.group_size)
    return RLTrainer(
        config,
        TrainerParts(
            actor=actor,
            critic=critic,
            colocation=colocation,
            rollout=rollout,
            maker=maker,
            sampler=sampler,
            train_data=train_data,
            eval_data=eval_data,
            update=PolicyUpdate.from_config(config, world_size=info.world_size, layout=layout),
            critic_update=CriticUpdate(
                micro_batch_size=config.micro_train_batch_size,
                accumulation=per_rank_train // config.micro_train_batch_size,
                epochs=config.max_epochs,
                value_clip=config.value_clip_range,
                max_tokens_per_micro_batch=config.max_tokens_per_micro_batch,
                layout=layout,
            ),
            buffer=ReplayBuffer(seed=config.seed, group=layout.group),
            old_logprob_pass=needs_old_logprob_pass(config, actor.module),
            records=RunRecords.for_run(config, info.rank),
            watch=watch,
            export=export if config.save_hf_model else None,
            device=backend.device,
            teacher=make_teacher(config, teacher_model, maker.logprobs),
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
