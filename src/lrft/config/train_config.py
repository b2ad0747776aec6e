"""The trainer's settings: one frozen record, validated whole before any process group starts.

:class:`TrainConfig` is :class:`lrft.config.fields.TrainFields` (every field, each
checked on its own as it is set), checked across fields at construction
(:mod:`lrft.config.checks`), with the values derived from its fields: the defaults of
the settings left unset, the policy loss's settings, the engine's memory share.
:meth:`TrainConfig.validate_world` checks the rules that depend on the number of ranks, read from
torchrun's environment before ``init_process_group``, and :meth:`TrainConfig.validate_inputs`
those that read this machine (:mod:`lrft.config.inputs`). Errors name the value and the
rule.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from typing import Any, cast

import attrs

from lrft.algo import (
    AdaptiveKLController,
    AdvantageParams,
    AggregationMode,
    FixedKLController,
    KLController,
    PolicyLossConfig,
    advantage_estimators,
)
from lrft.api.episodes import EpisodeBudget
from lrft.api.errors import ConfigError
from lrft.api.optim import OptimizerConfig, ScheduleKind, SchedulerConfig
from lrft.backends.train.lora import LoraSettings
from lrft.config import (
    checks,
    distill_checks,
    episodes,
    inputs,
    knobs,
    long_sequences,
    media_checks,
    packages,
    split_checks,
)
from lrft.config.fields import TrainFields
from lrft.config.problems import gathered_validators, reporting

DEFAULT_GAMMA = 1.0
DEFAULT_LAMBD = 0.95
DEFAULT_CRITIC_LEARNING_RATE = 9e-6
DEFAULT_VALUE_CLIP = 0.2
DEFAULT_TIS_CAP = 2.0
DEFAULT_OVERLONG_PENALTY_FACTOR = 1.0
DEFAULT_FIRE_TEMPERATURE = 10.0
DEFAULT_MAX_NUM_GEN_BATCHES = 4
DEFAULT_OPD_KL_COEF = 1.0
MIN_LR_RATIO_WITH_MIN_LR = 0.1
"""``cosine_with_min_lr``'s floor when ``min_lr_ratio`` is unset (LightRFT's: a tenth of the
rate)."""
DEFAULT_ENGINE_MEM_UTIL = 0.5
"""The vllm engine's share of a device when ``engine_mem_util`` is unset (LightRFT's default):
the other half stays with training."""
CPU_KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
"""vLLM's CPU KV-cache size in GiB; when set, vLLM 0.32 never reads ``gpu_memory_utilization``."""


CONFIG_CHECKS: tuple[Callable[[TrainFields], None], ...] = (
    checks.check_run_settings,
    checks.check_reward_settings,
    checks.check_training_settings,
    checks.check_estimator_settings,
    checks.check_algorithm_settings,
    checks.check_observability_settings,
    checks.check_engine_settings,
    checks.check_lora_settings,
    knobs.check_knob_settings,
    episodes.check_episode_settings,
    media_checks.check_media_settings,
    split_checks.check_split_settings,
    long_sequences.check_long_sequence_settings,
    distill_checks.check_distillation_settings,
    distill_checks.check_process_reward_settings,
    packages.check_packages,
)
"""The rules across fields, each run whatever the others find (see :mod:`lrft.config.problems`)."""


@attrs.frozen(kw_only=True, field_transformer=gathered_validators)
class TrainConfig(TrainFields):
    """Everything ``lrft train`` does; see ``lrft train --help`` for each field's meaning.

    Construction checks the fields, then every rule across them, and raises one
    ``ConfigError`` listing each problem of those rules; inside :func:`lrft.config.problems.gathering`
    it reports its fields' problems too, and raises nothing."""

    def __attrs_post_init__(self) -> None:
        with reporting() as problems:
            problems.check_each(CONFIG_CHECKS, self)
            problems.check(self._check_policy_loss)

    def _check_policy_loss(self) -> None:
        checks.check_policy_loss(self, self.policy_loss_config())

    def validate_world(self, world_size: int) -> None:
        """The rules that depend on the number of ranks; raises ``ConfigError`` naming each."""
        checks.validate_world(self, world_size)

    def validate_inputs(self) -> None:
        """The rules that read this machine: every model folder (``pretrain``,
        ``reward_pretrain``, ``critic_pretrain``) has a config, weights and (but the critic's)
        tokenizer files, the prompt files and ``deepspeed_config`` exist, and the
        ``remote_rm_auth_env`` variables are set. Raises ``ConfigError`` naming the flag, the
        path and what is missing."""
        inputs.validate_inputs(self)

    def engine_memory_share(
        self, *, local_world_size: int, on_cuda: bool, environ: Mapping[str, str] = os.environ
    ) -> float:
        """The vllm engine's ``gpu_memory_utilization`` on this rank; raises ``ConfigError``.

        CUDA: the share of this rank's GPU for the engine's weights, activations and KV cache.
        CPU: vLLM 0.32's CPU worker reads the same setting as the share of the host's memory
        (its NUMA node's) that its process may grow to, and gives the KV cache that share minus
        what the process already holds, trainer included. The ranks of a host share that memory,
        so ``engine_mem_util * local_world_size`` must be <= 1, and the unset default splits 0.5
        over them. ``VLLM_CPU_KVCACHE_SPACE`` (GiB) replaces the share on CPU: with it set, an
        ``engine_mem_util`` would be ignored and is refused.
        """
        share = self.engine_mem_util
        if on_cuda:
            return DEFAULT_ENGINE_MEM_UTIL if share is None else share
        if share is None:
            return DEFAULT_ENGINE_MEM_UTIL / local_world_size
        if environ.get(CPU_KV_CACHE_ENV, "") != "":
            raise ConfigError(
                f"engine_mem_util {share} would be ignored: {CPU_KV_CACHE_ENV}="
                f"{environ[CPU_KV_CACHE_ENV]} is set, and vLLM's CPU backend then sizes its KV "
                f"cache from it alone; unset one of them"
            )
        if share * local_world_size > 1.0:
            raise ConfigError(
                f"engine_mem_util {share} x {local_world_size} ranks on this host = "
                f"{share * local_world_size:.2f} of the host's memory: on CPU the ranks of a host "
                "share its memory, so engine_mem_util x ranks per host must be <= 1"
            )
        return share

    @property
    def checkpoint_dir(self) -> str:
        """The folder holding the run's checkpoints: ``ckpt_path``, its parent when it names one
        checkpoint (:attr:`resume_from`), else ``SAVE_PATH/checkpoints``."""
        if self.resume_from is not None:
            return os.path.dirname(self.resume_from) or "."
        return self.ckpt_path if self.ckpt_path is not None else f"{self.save_path}/checkpoints"

    @property
    def resume_from(self) -> str | None:
        """The one checkpoint ``ckpt_path`` names (a ``global_step<k>`` folder), resumed instead
        of the newest; ``None`` when it names the folder holding them, or is unset."""
        if self.ckpt_path is None:
            return None
        path = self.ckpt_path.rstrip("/")
        return path if knobs.CHECKPOINT_NAME.fullmatch(os.path.basename(path)) else None

    @property
    def staleness_bound(self) -> int:
        """K: how many versions a trained sample may lag the trainer (0: synchronous)."""
        return self.max_staleness or 0

    @property
    def samples_per_rollout(self) -> int:
        return self.rollout_batch_size * self.n_samples_per_prompt

    @property
    def uses_critic(self) -> bool:
        """Whether the estimator reads critic values, so that a critic is trained."""
        return advantage_estimators.get(self.advantage_estimator).needs_values

    @property
    def uses_teacher(self) -> bool:
        """Whether the estimator reads a teacher's logprobs (on-policy distillation)."""
        return advantage_estimators.get(self.advantage_estimator).needs_teacher

    @property
    def advantage_params(self) -> AdvantageParams:
        """The estimator's parameters, with the defaults for ``gamma``, ``lambd`` and
        ``opd_kl_coef`` when unset."""
        return AdvantageParams(
            gamma=DEFAULT_GAMMA if self.gamma is None else self.gamma,
            lambd=DEFAULT_LAMBD if self.lambd is None else self.lambd,
            opd_kl_coef=DEFAULT_OPD_KL_COEF if self.opd_kl_coef is None else self.opd_kl_coef,
        )

    @property
    def critic_lr(self) -> float:
        """``critic_learning_rate``, or its default when unset."""
        rate = self.critic_learning_rate
        return DEFAULT_CRITIC_LEARNING_RATE if rate is None else rate

    @property
    def value_clip_range(self) -> float | None:
        """``value_clip`` (its default when unset), ``None`` when set to 0 (clipping off)."""
        clip = DEFAULT_VALUE_CLIP if self.value_clip is None else self.value_clip
        return clip if clip > 0 else None

    def policy_loss_config(self) -> PolicyLossConfig:
        """The settings of ``policy_loss_type`` from the flags (``generate_max_len`` is the
        constant divisor of ``seq-mean-token-sum-norm``)."""
        low, high = (None, None) if self.eps_clip_low_high is None else self.eps_clip_low_high
        mode = cast("AggregationMode | None", self.loss_agg_mode)
        return PolicyLossConfig(
            eps_clip=self.eps_clip,
            eps_clip_low=low,
            eps_clip_high=high,
            dual_clip=self.dual_clip,
            aggregation=mode,
            max_len=self.generate_max_len if mode == "seq-mean-token-sum-norm" else None,
            tis_cap=self.truncated_is_cap,
        )

    @property
    def truncated_is_cap(self) -> float | None:
        """The importance-weight cap in force: ``tis_cap`` (2 when unset); ``None`` without TIS."""
        if not self.use_tis:
            return None
        return DEFAULT_TIS_CAP if self.tis_cap is None else self.tis_cap

    @property
    def overlong_factor(self) -> float:
        """``overlong_penalty_factor``, or its default when unset."""
        factor = self.overlong_penalty_factor
        return DEFAULT_OVERLONG_PENALTY_FACTOR if factor is None else factor

    @property
    def first_token_temperature(self) -> float | None:
        """FIRE's first-token temperature (10 when unset); ``None`` without FIRE sampling."""
        if not self.use_fire_sampling:
            return None
        temperature = self.fire_first_token_temperature
        return DEFAULT_FIRE_TEMPERATURE if temperature is None else temperature

    @property
    def generate_rounds(self) -> int:
        """Generate rounds per iteration: ``max_num_gen_batches`` (4 when unset) with dynamic
        sampling, else 1."""
        if not self.dynamic_sampling:
            return 1
        rounds = self.max_num_gen_batches
        return DEFAULT_MAX_NUM_GEN_BATCHES if rounds is None else rounds

    @property
    def lora(self) -> LoraSettings | None:
        """The actor's LoRA adapters; ``None`` when it trains all its weights (``lora_rank`` 0)."""
        if self.lora_rank == 0:
            return None
        return LoraSettings(
            rank=self.lora_rank,
            alpha=self.lora_alpha,
            dropout=self.lora_dropout,
            target_modules=self.target_modules,
        )

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)

    # --- the optimizer and its schedule, KL control, sources and backends by name -------------

    def optimizer_config(self, lr: float) -> OptimizerConfig:
        """AdamW at ``lr`` with ``adam_betas``, ``l2`` and ``max_norm`` (actor and critic)."""
        return OptimizerConfig(
            lr=lr, betas=self.adam_betas, weight_decay=self.l2, max_grad_norm=self.max_norm
        )

    def planned_iterations(self, batches_per_epoch: int) -> int:
        """The iterations of a run whose prompts make ``batches_per_epoch`` rollout batches:
        ``num_episodes`` passes, at most ``max_steps``."""
        iterations = self.num_episodes * batches_per_epoch
        return iterations if self.max_steps is None else min(iterations, self.max_steps)

    @property
    def optimizer_steps_per_iteration(self) -> int:
        """Optimizer steps of one iteration: ``max_epochs`` passes over its samples in
        ``train_batch_size`` steps."""
        return self.samples_per_rollout // self.train_batch_size * self.max_epochs

    def scheduler_config(self, iterations: int) -> SchedulerConfig:
        """The learning-rate schedule over a run of ``iterations`` iterations; raises
        ``ConfigError`` when a decaying schedule has no step left after its warm-up."""
        total = iterations * self.optimizer_steps_per_iteration
        warmup = math.ceil(total * self.lr_warmup_ratio)
        with_min_lr = self.lr_scheduler == "cosine_with_min_lr"
        kind: ScheduleKind = "cosine" if with_min_lr else cast("ScheduleKind", self.lr_scheduler)
        floor = self.min_lr_ratio
        if floor is None:
            floor = MIN_LR_RATIO_WITH_MIN_LR if with_min_lr else 0.0
        if kind != "constant" and total <= warmup:
            raise ConfigError(
                f"lr_scheduler {self.lr_scheduler!r} decays over the run's {total} optimizer "
                f"steps after {warmup} warm-up steps (lr_warmup_ratio {self.lr_warmup_ratio}), "
                "which leaves none to decay over: train longer or lower lr_warmup_ratio"
            )
        return SchedulerConfig(
            kind=kind,
            warmup_steps=warmup,
            total_steps=None if kind == "constant" else total,
            min_lr_ratio=floor,
        )

    def kl_controller(self) -> KLController:
        """The KL coefficient: adaptive towards ``kl_target`` when set, else ``init_kl_coef``."""
        if self.kl_target is None:
            return FixedKLController(value=self.init_kl_coef)
        horizon = knobs.DEFAULT_KL_HORIZON if self.kl_horizon is None else self.kl_horizon
        return AdaptiveKLController(value=self.init_kl_coef, target=self.kl_target, horizon=horizon)

    @property
    def prompt_sources(self) -> tuple[str, ...]:
        """The training prompt sources (``prompt_data`` holds them comma-separated)."""
        return knobs.prompt_sources(self.prompt_data)

    @property
    def train_backend_name(self) -> str:
        """The registered train backend this config trains with (see ``train_backend``)."""
        return knobs.train_backend_name(self)

    def episode_budget(self) -> EpisodeBudget | None:
        """Each episode's budget (``max_turns``, ``max_episode_tokens``, ``generate_max_len`` a
        turn); ``None`` without an environment."""
        if self.environment is None:
            return None
        return EpisodeBudget(
            max_turns=self.max_turns or episodes.DEFAULT_MAX_TURNS,
            max_total_tokens=self.max_episode_tokens or episodes.DEFAULT_MAX_EPISODE_TOKENS,
            max_turn_tokens=self.generate_max_len,
        )

    def environment_option_values(self) -> dict[str, object]:
        """``environment_options`` parsed (a JSON object, checked when set); ``{}`` unset."""
        if self.environment_options is None:
            return {}
        options: dict[str, object] = json.loads(self.environment_options)
        return options
