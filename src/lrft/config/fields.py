"""Every setting of :class:`lrft.config.TrainConfig`: its name, default, own rule and
meaning.

Field names are LightRFT's flag names (``--rollout_batch_size`` is ``rollout_batch_size``), so a
LightRFT command line or config file reads the same here. Each field's own rule is checked as it
is set (:mod:`lrft.config.validators`); the rules across fields (:mod:`lrft.config.checks`) run
when a :class:`TrainConfig` is made, which is why :class:`TrainFields` is not made on its own.
The settings a rollout reads come first (:class:`lrft.config.rollout_fields.RolloutFields`),
then those of training, the algorithm, the backends and the outputs (:class:`TrainFields`); as
there, a field's docstring is its flag's help and its metadata the flag's ``--help`` section.
"""

from __future__ import annotations

from typing import Any

import attrs

from lrft.algo import AGGREGATION_MODES, advantage_estimators, kl_estimators, policy_losses
from lrft.api import validators as v
from lrft.api.errors import ConfigError
from lrft.config import validators as f
from lrft.config.flag_spec import (
    ALGORITHM,
    BACKEND,
    CRITIC,
    LORA,
    MODEL_AND_DATA,
    OUTPUT,
    REWARDS,
    ROLLOUT,
    TRAINING,
    FlagGroup,
    flag,
    optional_int,
)
from lrft.config.rollout_fields import RolloutFields, registered
from lrft.config.validators import ATTENTION_KERNELS, LR_SCHEDULERS
from lrft.extras import PLOTS_EXTRA, tensorboard_available


def _tensorboard_default(config: TrainFields) -> bool:
    # The demo and the presets promise TensorBoard logs, but tensorboard is optional: on when it
    # is installed.
    built_in = config.pretrain is None or config.preset is not None
    return built_in and tensorboard_available()


def _tensorboard_installed(_: object, attribute: attrs.Attribute[Any], value: bool) -> None:
    # Checked here, next to the default that reads the same availability.
    if value and not tensorboard_available():
        raise ConfigError(
            f"{attribute.name} needs the tensorboard package, which is not installed: {PLOTS_EXTRA}"
        )


@attrs.frozen(kw_only=True)
class TrainFields(RolloutFields):
    """The fields of :class:`lrft.config.TrainConfig`, each checked on its own as it is set."""

    # training --------------------------------------------------------------------------------
    train_batch_size: int = attrs.field(default=128, validator=v.positive_int, metadata=TRAINING)
    """Samples per optimizer step, over all ranks; must divide ``rollout_batch_size`` x
    ``n_samples_per_prompt``."""
    micro_train_batch_size: int = attrs.field(
        default=16, validator=v.positive_int, metadata=TRAINING
    )
    """Samples per forward/backward per rank (gradient accumulation fills
    ``train_batch_size``)."""
    max_tokens_per_micro_batch: int | None = attrs.field(
        default=None, validator=f.optional_positive, metadata=TRAINING
    )
    """Pack each optimizer step's samples (policy and, with gae, critic) into forward/backward
    passes of at most this many padded tokens per rank (samples x longest) instead of
    ``micro_train_batch_size`` samples; the loss is still aggregated over
    ``micro_train_batch_size`` groups, so gradients do not change (unset: off)."""
    max_epochs: int = attrs.field(default=1, validator=v.positive_int, metadata=TRAINING)
    """Policy epochs over each iteration's experience."""
    num_episodes: int = attrs.field(default=1, validator=v.positive_int, metadata=TRAINING)
    """Passes over the training prompts."""
    max_steps: int | None = attrs.field(
        default=None, metadata=flag(FlagGroup.TRAINING, kind=optional_int)
    )
    """Stop after N iterations (unset: ``num_episodes`` passes)."""
    actor_learning_rate: float = attrs.field(
        default=1e-6, validator=v.positive_number, metadata=TRAINING
    )
    """AdamW's learning rate of the actor."""
    l2: float = attrs.field(default=0.0, validator=v.non_negative, metadata=TRAINING)
    """AdamW's weight decay."""
    max_norm: float = attrs.field(default=1.0, validator=v.non_negative, metadata=TRAINING)
    """The gradient-norm clip (0: off)."""
    advantage_estimator: str = attrs.field(
        default="group_norm",
        validator=f.estimator,
        metadata=flag(FlagGroup.ALGORITHM, choices=advantage_estimators.names),
    )
    """The advantage estimator; gae (PPO) trains a critic alongside the actor."""
    eps_clip: float = attrs.field(default=0.2, validator=v.positive_number, metadata=ALGORITHM)
    """PPO's ratio clip."""
    gamma: float | None = attrs.field(
        default=None, validator=f.optional_unit_interval, metadata=ALGORITHM
    )
    """The discount per response token, for gae, reinforce and reinforce++ (unset: 1)."""
    lambd: float | None = attrs.field(
        default=None, validator=f.optional_unit_interval, metadata=ALGORITHM
    )
    """GAE's lambda, for gae only (unset: 0.95)."""
    critic_pretrain: str | None = attrs.field(default=None, metadata=CRITIC)
    """The critic's initial weights: a causal LM folder (its value head starts fresh) or a saved
    critic (unset: ``pretrain``); gae only."""
    critic_learning_rate: float | None = attrs.field(
        default=None, validator=f.optional_positive_float, metadata=CRITIC
    )
    """The critic's AdamW learning rate (unset: 9e-6; ``l2`` and ``max_norm`` apply too); gae
    only."""
    value_clip: float | None = attrs.field(
        default=None, validator=f.optional_non_negative, metadata=CRITIC
    )
    """PPO's value clip: how far new values may move from the experience pass's before the
    value loss stops rewarding it (0: off; unset: 0.2); gae only."""
    init_kl_coef: float = attrs.field(default=0.0, validator=v.non_negative, metadata=ALGORITHM)
    """The KL coefficient against a frozen reference model (0: no reference model)."""
    kl_estimator: str = attrs.field(
        default="k3",
        validator=f.kl_estimator,
        metadata=flag(FlagGroup.ALGORITHM, choices=kl_estimators.names),
    )
    """The KL estimator."""
    use_kl_loss: bool = attrs.field(default=False, metadata=ALGORITHM)
    """KL in the loss (GRPO) instead of in the reward."""
    normalize_reward: bool = attrs.field(default=False, metadata=REWARDS)
    """Scale rewards by running statistics all-gathered across ranks (kept in checkpoints)."""
    # policy loss and sampling algorithms (lrft.algo) ---------------------------------------
    policy_loss_type: str = attrs.field(
        default="ppo",
        validator=f.policy_loss,
        metadata=flag(FlagGroup.ALGORITHM, choices=policy_losses.names),
    )
    """The policy loss: ppo (token ratio clip), gspo (clipped sequence ratio), gmpo (geometric
    mean of clipped token ratios), cpgd (clipped log-ratio), or one a plug-in registers."""
    eps_clip_low_high: tuple[float, float] | None = attrs.field(
        default=None,
        converter=f.clip_pair,
        metadata=flag(FlagGroup.ALGORITHM, metavar=("LOW", "HIGH")),
    )
    """Decoupled clip (DAPO's clip-higher): the ratio is clipped to [1 - LOW, 1 + HIGH];
    replaces ``eps_clip``."""
    dual_clip: float | None = attrs.field(default=None, metadata=ALGORITHM)
    """Dual-clip PPO's constant c > 1: a negative-advantage token's loss is at most -A c (ppo
    only)."""
    loss_agg_mode: str | None = attrs.field(
        default=None,
        validator=f.aggregation,
        metadata=flag(FlagGroup.ALGORITHM, choices=AGGREGATION_MODES),
    )
    """How token losses become the loss (unset: token-mean; seq-mean-token-sum-norm divides by
    ``generate_max_len``); token-level losses only (not gspo, gmpo)."""
    entropy_loss_coef: float | None = attrs.field(
        default=None, validator=f.optional_non_negative, metadata=ALGORITHM
    )
    """Entropy bonus: the loss gets - coef x entropy (aggregated like the loss); 0 logs
    policy/entropy only; unset: the entropy is not computed."""
    high_entropy_token_ratio: float = attrs.field(
        default=0.0, validator=f.token_ratio, metadata=ALGORITHM
    )
    """Train only on this top fraction of each micro-batch's tokens by entropy (e.g. 0.2); 0:
    every token; token-level losses only."""
    use_tis: bool = attrs.field(default=False, metadata=ALGORITHM)
    """Truncated importance sampling: weight each token's loss by min(exp(old - engine
    logprob), ``tis_cap``), with the engine's own logprobs of the rollout."""
    tis_cap: float | None = attrs.field(
        default=None, validator=f.optional_positive_float, metadata=ALGORITHM
    )
    """The TIS weight cap (unset: 2; needs ``use_tis``)."""
    overlong_buffer_len: int | None = attrs.field(
        default=None, validator=f.optional_positive, metadata=ALGORITHM
    )
    """DAPO's overlong shaping: responses longer than ``generate_max_len`` - N lose up to
    ``overlong_penalty_factor`` of reward, linearly over the last N tokens (unset: off)."""
    overlong_penalty_factor: float | None = attrs.field(
        default=None, validator=f.optional_non_negative, metadata=ALGORITHM
    )
    """The overlong penalty at ``generate_max_len`` (unset: 1; needs ``overlong_buffer_len``)."""
    use_fire_sampling: bool = attrs.field(default=False, metadata=ROLLOUT)
    """FIRE: sample each response's first token at ``fire_first_token_temperature`` and the rest
    at ``temperature``; logprobs use the same temperatures."""
    fire_first_token_temperature: float | None = attrs.field(
        default=None, validator=f.optional_positive_float, metadata=ROLLOUT
    )
    """FIRE's first-token temperature (unset: 10; needs ``use_fire_sampling``)."""
    dynamic_sampling: bool = attrs.field(default=False, metadata=ROLLOUT)
    """DAPO's dynamic sampling: drop prompts whose responses all score the same and refill the
    batch with further prompts (up to ``max_num_gen_batches`` generate rounds)."""
    max_num_gen_batches: int | None = attrs.field(
        default=None, validator=f.optional_positive, metadata=ROLLOUT
    )
    """Generate rounds per iteration with ``dynamic_sampling``, the first included (unset: 4);
    when they run out the batch is completed with dropped groups."""
    gradient_checkpointing: bool = attrs.field(default=False, metadata=TRAINING)
    """Recompute activations in backward."""
    # the train backend -----------------------------------------------------------------------
    fsdp_cpu_offload: bool = attrs.field(default=False, metadata=BACKEND)
    """Keep FSDP2 parameters, gradients and optimizer state on the host."""
    fsdp_reshard_after_forward: bool = attrs.field(default=True, metadata=BACKEND)
    """Free each FSDP2 layer's gathered weights after its forward and gather them again for its
    backward; off (--no-fsdp_reshard_after_forward) keeps them until the backward: one
    all-gather per layer and micro-batch instead of two, holding a full compute-dtype copy of
    each trained model (policy, critic) during its update."""
    fsdp_defer_gradient_sync: bool = attrs.field(default=False, metadata=BACKEND)
    """With several micro-batches per optimizer step, reduce FSDP2 gradients (and gather
    weights) once per step instead of once per micro-batch, holding unsharded fp32 gradients and
    gathered weights through the step (on one GPU only the weights are extra)."""
    zero_stage: int | None = attrs.field(default=None, validator=f.zero_stage, metadata=BACKEND)
    """Train with DeepSpeed ZeRO stage 1, 2 or 3 instead of FSDP2 (``pip install
    'lrft[deepspeed]'``)."""
    deepspeed_config: str | None = attrs.field(default=None, metadata=BACKEND)
    """A DeepSpeed JSON file merged into the config lrft generates (needs ``zero_stage``);
    conflicting keys are an error."""
    adam_offload: bool = attrs.field(default=False, metadata=BACKEND)
    """Keep optimizer state on the host outside the policy phase."""
    seed: int = attrs.field(default=42, metadata=TRAINING)
    """The seed of data order, rollouts and shuffling."""
    # LoRA (lrft.backends.train.lora) ---------------------------------------------------------
    lora_rank: int = attrs.field(default=0, validator=v.non_negative_int, metadata=LORA)
    """Train LoRA adapters of this rank on the actor instead of all its weights (0: off); the
    KL reference is the actor with its adapters disabled, and the engine gets the merged
    weights."""
    lora_alpha: int = attrs.field(default=16, validator=v.positive_int, metadata=LORA)
    """The adapters' scaling is lora_alpha / lora_rank (needs ``lora_rank``)."""
    lora_dropout: float = attrs.field(
        default=0.0, validator=v.unit_interval_closed_open, metadata=LORA
    )
    """Dropout on the adapters' input while training (needs ``lora_rank``)."""
    target_modules: tuple[str, ...] = attrs.field(
        default=("all-linear",),
        converter=f.module_names,
        metadata=flag(FlagGroup.LORA, nargs="+", metavar="NAME"),
    )
    """The linear modules given adapters: names or name suffixes (q_proj v_proj, or
    q_proj,v_proj), or all-linear for every linear module but the output head; a name that
    matches no module is an error (needs ``lora_rank``)."""
    # outputs ---------------------------------------------------------------------------------
    save_path: str = attrs.field(default="./lrft_output", metadata=OUTPUT)
    """The output folder of one run: metrics.jsonl, hf_model/, curves.png, tensorboard/,
    run.json (a folder holding another run's outputs is refused)."""
    ckpt_path: str | None = attrs.field(default=None, metadata=OUTPUT)
    """The checkpoint folder, or one checkpoint in it to resume (unset:
    SAVE_PATH/checkpoints)."""
    save_steps: int = attrs.field(default=-1, validator=f.every_n_or_never, metadata=OUTPUT)
    """Checkpoint every N iterations (-1: never)."""
    max_ckpt_num: int = attrs.field(default=3, validator=v.positive_int, metadata=OUTPUT)
    """Checkpoints kept (the oldest removed)."""
    load_checkpoint: bool = attrs.field(default=False, metadata=OUTPUT)
    """Resume from the latest complete checkpoint in ``ckpt_path``; its settings must match but
    for the run's length, paths, cadences, logging, memory and speed settings
    (:data:`lrft.run.resume.RESUMABLE_SETTINGS`)."""
    overwrite_output: bool = attrs.field(default=False, metadata=OUTPUT)
    """Start a new run in a ``save_path`` (or ``ckpt_path``) that holds another run's outputs,
    removing exactly lrft's outputs there first (metrics, TensorBoard logs, curves,
    trajectories, W&B files, hf_model, checkpoints); without it such a run is refused."""
    eval_steps: int = attrs.field(default=-1, validator=f.every_n_or_never, metadata=OUTPUT)
    """Evaluate every N iterations (-1: at the start and the end only)."""
    save_hf_model: bool = attrs.field(default=True, metadata=OUTPUT)
    """Export the final weights to SAVE_PATH/hf_model (safetensors)."""
    use_tensorboard: bool = attrs.field(
        default=attrs.Factory(_tensorboard_default, takes_self=True),
        validator=_tensorboard_installed,
        metadata=flag(
            FlagGroup.OUTPUT,
            computed_default="on for the built-in demo and presets when tensorboard is "
            "installed, else off",
        ),
    )
    """Also write the metrics as TensorBoard scalars under SAVE_PATH/tensorboard (``pip install
    'lrft[plots]'``)."""
    use_wandb: bool = attrs.field(default=False, validator=f.wandb_switch, metadata=OUTPUT)
    """Also log the config and metrics to Weights & Biases from rank 0 (``pip install
    'lrft[wandb]'``). A switch, unlike LightRFT's flag (which takes the API key): the key comes
    from WANDB_API_KEY or ``wandb login``, never from a flag, so it never appears in process
    lists, config files or checkpoints; WANDB_MODE=offline logs to local files."""
    wandb_project: str | None = attrs.field(default=None, metadata=OUTPUT)
    """The W&B project (unset: lrft; needs ``use_wandb``)."""
    wandb_org: str | None = attrs.field(default=None, metadata=OUTPUT)
    """The W&B entity (user or team) owning the run (unset: the account's; needs
    ``use_wandb``)."""
    wandb_group: str | None = attrs.field(default=None, metadata=OUTPUT)
    """The W&B run group (needs ``use_wandb``)."""
    wandb_run_name: str | None = attrs.field(default=None, metadata=OUTPUT)
    """The W&B run's display name (unset: chosen by W&B; needs ``use_wandb``)."""
    progress_bar: bool = attrs.field(default=True, metadata=OUTPUT)
    """Draw a progress bar on rank 0 when stdout is a terminal; off, or with a non-terminal
    stdout, one line per step is printed instead. Libraries' own bars (model loading, export,
    vLLM) appear only on rank 0, with this on and stderr a terminal."""
    save_trajectories: bool = attrs.field(default=False, metadata=OUTPUT)
    """Write every sample of each iteration (texts, token counts, reward, advantage) to
    SAVE_PATH/trajectories/step_<k>.jsonl."""
    save_trajectories_steps: int | None = attrs.field(
        default=None, validator=f.optional_positive, metadata=OUTPUT
    )
    """With ``save_trajectories``, only every N iterations (unset: every iteration)."""
    collective_timeout_s: float = attrs.field(
        default=600.0, validator=v.positive_number, metadata=BACKEND
    )
    """Seconds a rank waits at a collective for the slowest rank before it fails with a
    CollectiveTimeout naming its phase, its step and the other ranks' (exit code 3). It bounds
    what one rank may do while the others wait: generation skew, a reward service's retries
    (checked), a first compile, the rank that writes the export. A silent (stopped or dead) rank
    is reported after half of it, at most 60 s (:mod:`lrft.dist.watchdog`)."""
    # the learning-rate schedule and optimizer -----------------------------------------------
    lr_scheduler: str = attrs.field(
        default="constant",
        validator=f.lr_scheduler,
        metadata=flag(FlagGroup.TRAINING, choices=LR_SCHEDULERS),
    )
    """The learning rate after the warm-up: constant, or linear / cosine decay to
    ``min_lr_ratio`` x the rate at the run's last optimizer step; cosine_with_min_lr (LightRFT's)
    decays to 0.1 x the rate; actor and critic."""
    lr_warmup_ratio: float = attrs.field(default=0.0, validator=f.warmup_ratio, metadata=TRAINING)
    """The share of the run's optimizer steps over which the learning rate rises linearly to
    its value (LightRFT's default: 0.03)."""
    min_lr_ratio: float | None = attrs.field(
        default=None, validator=f.optional_unit_interval, metadata=TRAINING
    )
    """A decaying schedule's floor as a fraction of the rate (unset: 0, or 0.1 for
    cosine_with_min_lr; needs a decaying ``lr_scheduler``)."""
    adam_betas: tuple[float, float] = attrs.field(
        default=(0.9, 0.999),
        converter=f.beta_pair,
        metadata=flag(FlagGroup.TRAINING, metavar=("BETA1", "BETA2")),
    )
    """AdamW's betas for the actor and the critic (LightRFT's default: 0.9 0.95)."""
    # adaptive KL, reward and advantage clipping ----------------------------------------------
    kl_target: float | None = attrs.field(
        default=None, validator=f.optional_positive_float, metadata=ALGORITHM
    )
    """Adapt the KL coefficient, from ``init_kl_coef``, towards this KL per token (Ziegler et
    al. 2019's proportional controller, :class:`lrft.algo.AdaptiveKLController`; logged as
    kl/coef; unset: a fixed coefficient)."""
    kl_horizon: int | None = attrs.field(
        default=None, validator=f.optional_positive, metadata=ALGORITHM
    )
    """The adaptive controller's horizon in samples: an iteration moves the coefficient by at
    most 20% x its samples / horizon (unset: 10000; needs ``kl_target``)."""
    reward_clip: float = attrs.field(default=0.0, validator=v.non_negative, metadata=REWARDS)
    """Clip each reward to [-c, c] after shaping and ``normalize_reward`` (0: off)."""
    advantage_clip: float = attrs.field(default=0.0, validator=v.non_negative, metadata=ALGORITHM)
    """Clip each advantage to [-c, c] after the estimator's normalisation (0: off)."""
    # data ------------------------------------------------------------------------------------
    system_prompt: str | None = attrs.field(default=None, metadata=MODEL_AND_DATA)
    """A system message before each prompt (needs ``apply_chat_template``)."""
    prompt_data_probs: tuple[float, ...] | None = attrs.field(
        default=None,
        converter=f.probabilities,
        metadata=flag(FlagGroup.MODEL_AND_DATA, metavar="P[,P...]"),
    )
    """With several comma-separated ``prompt_data`` sources: each one's share of the mixed
    training prompts, summing to 1 (unset: every source as it is, one after another)."""
    prompt_split: str | None = attrs.field(default=None, metadata=MODEL_AND_DATA)
    """The split of a datasets DatasetDict folder to train on (unset: train)."""
    eval_split: str | None = attrs.field(default=None, metadata=MODEL_AND_DATA)
    """The held-out split: of ``eval_dataset``, or of ``prompt_data`` when no ``eval_dataset``
    is given (LightRFT's --eval_split test)."""
    # kernels, backends by name, plug-ins -----------------------------------------------------
    attn_implementation: str = attrs.field(
        default="sdpa",
        validator=f.attention,
        metadata=flag(FlagGroup.TRAINING, choices=ATTENTION_KERNELS),
    )
    """The trained models' attention kernel (actor, reference, critic, reward models):
    flash_attention_2 (LightRFT's --flash_attn) needs the flash-attn package and CUDA; the hf
    engine keeps its own kernel."""
    train_backend: str | None = attrs.field(
        default=None,
        validator=f.backend_name("train"),
        metadata=flag(FlagGroup.BACKEND, choices=registered("train")),
    )
    """The train backend by registered name: fsdp2 (LightRFT's --fsdp), deepspeed (needs
    ``zero_stage``), or one an installed package registers (entry-point group
    lrft.train_backends; unset: fsdp2, or deepspeed with ``zero_stage``)."""
    weight_sync: str = attrs.field(
        default="direct",
        validator=f.backend_name("sync"),
        metadata=flag(FlagGroup.BACKEND, choices=registered("sync")),
    )
    """The weight sync by registered name: direct, or one an installed package registers
    (entry-point group lrft.weight_syncs)."""
    plugins: tuple[str, ...] = attrs.field(
        default=(),
        converter=f.plugin_modules,
        metadata=flag(FlagGroup.ALGORITHM, metavar="MODULE[,MODULE...]"),
    )
    """Python modules imported first, on every rank: the advantage estimators, policy losses,
    KL estimators and backends they register can then be chosen by name."""

    @property
    def reward_count(self) -> int:
        """How many rewards are combined: reward_fn, each reward model, each judge, each remote
        service."""
        # Derived, yet here: the checks count the rewards.
        return (
            (self.reward_fn is not None)
            + len(self.reward_pretrain)
            + len(self.grm_pretrain)
            + len(self.remote_rm_url)
        )
