"""Build a ready :class:`RLTrainer` from a :class:`TrainConfig`: models, backend, engine, data.

Composes only the Protocols' implementations: the ``fsdp2`` (or DeepSpeed) TrainBackend, the
``hf`` or ``vllm`` engine and ``direct`` weight sync. With no ``pretrain`` the built-in demo
provides model, data and reward; a ``preset`` provides whichever of them the user left unset
(:mod:`lrft.trainer.presets`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
from torch.distributed import ProcessGroup
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from lrft.api.optim import OptimizerConfig
from lrft.api.protocols import FrozenModel, RolloutEngine, TrainableModel, TrainBackend
from lrft.api.types import ModelPart, SamplingParams
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.backends.sync.direct import DirectSync
from lrft.backends.train.fsdp2 import FSDP2Backend, FSDP2Config
from lrft.backends.train.lora import AdaptersDisabled, apply_lora, check_lora_model
from lrft.data import PromptDataConfig, PromptDataset, load_prompt_dataset
from lrft.dist import PhaseWatch, RankInfo, RolloutLayout, init_distributed
from lrft.rewards import RewardFn
from lrft.trainer import checkpoint as ckpt
from lrft.trainer import demo
from lrft.trainer.config import TrainConfig
from lrft.trainer.critic import load_critic
from lrft.trainer.episodes import EpisodeRollout, environment_setup
from lrft.trainer.experience import Decode, ExperienceMaker
from lrft.trainer.export import LORA_ADAPTER_DIR, export_hf, export_lora_adapter
from lrft.trainer.outputs import claim_outputs
from lrft.trainer.presets import preset_config
from lrft.trainer.resume import check_resume_settings
from lrft.trainer.rewards import build_reward, check_reward_settings, data_labels
from lrft.trainer.trainer import RLTrainer

if TYPE_CHECKING:
    from lrft.backends.train.deepspeed import ZeroStage

ENGINE_SLEEP_LEVEL = 2
"""Training rollouts sleep at level 2: a weight sync always follows and reloads the weights."""


def _rollout_dtype(info: RankInfo) -> torch.dtype:
    # The dtype the train backends compute in (bf16 mixed precision on CUDA, fp32 on the CPU),
    # so rollouts and training logprobs come from the same numerics.
    return torch.bfloat16 if info.device.type == "cuda" else torch.float32


def _hf_engine(pretrain: str, config: TrainConfig, info: RankInfo) -> RolloutEngine:
    chunk = config.micro_rollout_batch_size * config.n_samples_per_prompt
    engine_config = HFEngineConfig(
        dtype=_rollout_dtype(info), max_batch_size=chunk, decode=config.hf_decode
    )
    return HFRolloutEngine.from_pretrained(pretrain, config=engine_config)


def _vllm_engine(pretrain: str, config: TrainConfig, info: RankInfo) -> RolloutEngine:
    """One vLLM engine per TP group of consecutive ranks; collective over the default group."""
    # imported here: vllm is an optional dependency and lrft never imports it unasked
    from lrft.backends.rollout.vllm import VLLMEngineConfig, VLLMRolloutEngine

    chunk = config.micro_rollout_batch_size * config.n_samples_per_prompt
    engine_config = VLLMEngineConfig(
        dtype=_rollout_dtype(info),
        tp_size=config.engine_tp_size,
        max_model_len=(
            None
            if config.prompt_max_len is None
            else config.prompt_max_len + config.generate_max_len
        ),
        # the group's ranks hand their chunks to one engine
        max_num_seqs=chunk * config.engine_tp_size,
        gpu_memory_utilization=_engine_memory_share(config, info),
        seed=config.seed,
    )
    return VLLMRolloutEngine(pretrain, config=engine_config)


def _engine_memory_share(config: TrainConfig, info: RankInfo) -> float:
    return config.engine_memory_share(
        local_world_size=info.local_world_size, on_cuda=info.device.type == "cuda"
    )


ENGINES: dict[str, Callable[[str, TrainConfig, RankInfo], RolloutEngine]] = {
    "hf": _hf_engine,
    "vllm": _vllm_engine,
}
"""Rollout engines by ``--engine_type``; each entry must be listed in ``ENGINE_MAX_TP``."""


def train_backend(config: TrainConfig) -> TrainBackend:
    """FSDP2 by default; DeepSpeed ZeRO at ``config.zero_stage`` when it is set."""
    if config.zero_stage is None:
        return FSDP2Backend(
            FSDP2Config(
                cpu_offload=config.fsdp_cpu_offload,
                reshard_after_forward=config.fsdp_reshard_after_forward,
                defer_gradient_sync=config.fsdp_defer_gradient_sync,
            )
        )
    # imported here: deepspeed is an optional dependency and lrft never imports it unasked
    from lrft.backends.train.deepspeed import DeepSpeedBackend, DeepSpeedConfig, read_override

    override = (
        {} if config.deepspeed_config is None else read_override(Path(config.deepspeed_config))
    )
    stage = cast("ZeroStage", config.zero_stage)
    return DeepSpeedBackend(DeepSpeedConfig(zero_stage=stage, override=override))


def build_critic(
    config: TrainConfig, backend: TrainBackend
) -> tuple[TrainableModel, frozenset[ModelPart]]:
    """The critic wrapped by ``backend`` (from ``critic_pretrain``, else ``pretrain``), and the
    parts of it that live on the host outside its phases. Collective (``prepare_trainable``)."""
    path = config.critic_pretrain if config.critic_pretrain is not None else config.pretrain
    assert path is not None
    model = load_critic(path, seed=config.seed)
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable()  # type: ignore[no-untyped-call]  # unannotated in transformers
    critic = backend.prepare_trainable(
        model,
        optimizer=OptimizerConfig(
            lr=config.critic_lr, weight_decay=config.l2, max_grad_norm=config.max_norm
        ),
    )
    parts: set[ModelPart] = set()
    if config.enable_engine_sleep:
        # Like the reference model: out of the engine's way except during its own phases.
        parts |= {ModelPart.PARAMETERS, ModelPart.OPTIMIZER}
    if config.adam_offload:
        parts.add(ModelPart.OPTIMIZER)
    # A backend that can move nothing (FSDP2 cpu_offload) keeps every part on the host already.
    return critic, frozenset(parts) & backend.capabilities.offload


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
    )


def _check_outputs(config: TrainConfig, rank: int) -> None:
    """Whether this run may write into its folders (:func:`claim_outputs`, which with
    ``overwrite_output`` clears them), before the demo or a preset writes its prompt files."""
    removed = claim_outputs(config, rank=rank)
    if removed is not None:
        print(removed, flush=True)


def _check_resume(config: TrainConfig) -> None:
    """A resume's settings against its checkpoint's, once the demo or preset filled them in."""
    latest = ckpt.latest_checkpoint(Path(config.checkpoint_dir))
    if config.load_checkpoint and latest is not None:
        check_resume_settings(ckpt.read_manifest(latest), config, latest)


def build_trainer(config: TrainConfig, rank_info: RankInfo | None = None) -> RLTrainer:
    """Check the run's folders, settings and files, then start the process group (with the
    configured collective timeout) and its phase watch, and build everything."""
    info = rank_info if rank_info is not None else RankInfo.from_env()
    config.validate_world(info.world_size)
    if config.engine_type == "vllm":
        _engine_memory_share(config, info)  # its ConfigError before any process group starts
    _check_outputs(config, info.rank)
    if config.preset is not None:
        config = preset_config(config, info.rank)
    elif config.pretrain is None:
        config = demo.demo_config(config, info.rank)
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
    tokenizer = AutoTokenizer.from_pretrained(config.pretrain)
    train_data = _data(config, config.prompt_data, tokenizer, config.max_samples)
    eval_data = (
        None
        if config.eval_dataset is None
        else _data(config, config.eval_dataset, tokenizer, config.eval_max_samples)
    )

    backend = train_backend(config)
    model = AutoModelForCausalLM.from_pretrained(config.pretrain, dtype=torch.float32)
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable()  # type: ignore[no-untyped-call]  # unannotated in transformers
    # LoRA: the adapters are part of the model the backend wraps
    trained = model if config.lora is None else apply_lora(model, config.lora)
    actor = backend.prepare_trainable(
        trained,
        optimizer=OptimizerConfig(
            lr=config.actor_learning_rate, weight_decay=config.l2, max_grad_norm=config.max_norm
        ),
    )
    reference: FrozenModel | None = None
    if config.init_kl_coef > 0 and config.lora is not None:
        reference = AdaptersDisabled(actor)  # the actor's own base: no second copy of it
    elif config.init_kl_coef > 0:
        frozen = AutoModelForCausalLM.from_pretrained(config.pretrain, dtype=torch.float32)
        reference = backend.prepare_frozen(frozen)
    reward = build_reward(config, backend, data_labels([train_data, eval_data]))
    critic, critic_offload = (
        build_critic(config, backend) if config.uses_critic else (None, frozenset[ModelPart]())
    )
    engine = ENGINES[config.engine_type](config.pretrain, config, info)
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
        sync=DirectSync(),
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
