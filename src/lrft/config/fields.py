"""Every setting of :class:`lrft.config.TrainConfig`: its name, default, own rule and
meaning.

Field names are LightRFT's flag names (``--rollout_batch_size`` is ``rollout_batch_size``), so a
LightRFT command line or config file reads the same here. Each field's own rule is checked as it
is set (:mod:`lrft.config.validators`); the rules across fields
(:mod:`lrft.config.checks`) run when a :class:`TrainConfig` is made, which is why
:class:`TrainFields` is not made on its own.
"""

from __future__ import annotations

from typing import Any

import attrs

from lrft.api.errors import ConfigError
from lrft.config import validators as f
from lrft.data.images import DEFAULT_MAX_IMAGE_PIXELS
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
class TrainFields:
    """The fields of :class:`lrft.config.TrainConfig`, each checked on its own; see
    ``lrft train --help`` for each field's meaning."""

    # model and data ------------------------------------------------------------------------
    pretrain: str | None = None
    """A Hugging Face model folder; ``None`` runs the built-in demo (model, data and reward),
    or with ``preset`` the preset's model."""
    preset: str | None = attrs.field(default=None, validator=f.preset)
    """A built-in job on a real model (``smollm2``): its model, data, reward and settings fill
    in whatever is left unset (see :mod:`lrft.presets`)."""
    cache_dir: str | None = None
    """Where presets keep converted models; unset: ``$XDG_CACHE_HOME/lrft`` (``~/.cache/lrft``)."""
    prompt_data: str | None = None
    eval_dataset: str | None = None
    input_key: str = "input"
    label_key: str | None = None
    reference_key: str | None = None
    apply_chat_template: bool = False
    input_template: str | None = None
    prompt_max_len: int | None = attrs.field(default=None, validator=f.optional_positive)
    max_samples: int | None = attrs.field(default=None, validator=f.optional_positive)
    eval_max_samples: int | None = attrs.field(default=None, validator=f.optional_positive)
    # media (vision-language models) -------------------------------------------------------
    demo: str = attrs.field(default="addition", validator=f.demo)
    """The built-in demo run when no ``pretrain`` is given: ``addition`` (a tiny Qwen2) or
    ``vision`` (a tiny Qwen2-VL counting shapes in images)."""
    images_key: str | None = None
    """The column holding each prompt's images (paths relative to the data file, bytes,
    ``{"bytes", "path"}`` records); needs a vision-language ``pretrain`` and
    ``apply_chat_template`` (its template writes the image placeholders)."""
    limit_mm_image_per_prompt: int | None = attrs.field(default=None, validator=f.optional_positive)
    """A prompt with more images fails the data check at start-up (needs ``images_key``)."""
    max_image_pixels: int = attrs.field(default=DEFAULT_MAX_IMAGE_PIXELS, validator=f.positive)
    """An image with more pixels fails the data check at start-up."""
    freeze_vision_tower: bool = False
    """Train without the vision tower's weights (its projector still trains): they stay as
    loaded, and the optimizer holds no state for them."""
    audios_key: str | None = None
    """The column holding each prompt's audio clips (sound-file paths relative to the data
    file, bytes, ``{"bytes", "path"}`` records); needs an audio-language ``pretrain`` and
    ``apply_chat_template`` (its template writes the audio placeholders)."""
    limit_mm_audio_per_prompt: int | None = attrs.field(default=None, validator=f.optional_positive)
    """A prompt with more audio clips fails the data check at start-up (needs ``audios_key``)."""
    freeze_audio_tower: bool = False
    """Train without the audio encoder's weights (its projector still trains)."""
    # rewards ---------------------------------------------------------------------------------
    reward_fn: str | None = None
    """``math`` (math-verify on ``reference_key``) or ``module:function``; demo: exact match."""
    reward_pretrain: tuple[str, ...] = attrs.field(default=(), converter=f.reward_paths)
    """Scalar reward models (``*ForSequenceClassification`` folders with one label), scoring
    prompt + response; given as a list or LightRFT's comma-separated string."""
    remote_rm_url: tuple[str, ...] = attrs.field(
        default=(), converter=f.reward_urls, validator=f.http_urls, repr=f.redacted_repr
    )
    """Reward services (JSON over HTTP, see :mod:`lrft.rewards.remote`): one POST per batch, or
    per ``remote_rm_batch_size`` samples.
    Credentials in them (``user:password@``, ``?token=...``) are hidden wherever lrft shows or
    saves the config; ``remote_rm_auth_env`` keeps them off the command line."""
    remote_rm_timeout_s: float = attrs.field(default=30.0, validator=f.positive_float)
    remote_rm_max_attempts: int = attrs.field(default=3, validator=f.positive)
    remote_rm_protocol: str = attrs.field(default="lrft", validator=f.remote_protocol)
    """The services' request and reply format: ``lrft`` or ``openrlhf`` (OpenRLHF's and
    LightRFT's ``query``/``prompts``/``labels`` in, ``rewards`` out; see
    :mod:`lrft.rewards.remote_protocols`)."""
    remote_rm_batch_size: int | None = attrs.field(default=None, validator=f.optional_positive)
    """The most samples one POST carries; unset: a rank's whole batch in one POST."""
    remote_rm_max_concurrency: int = attrs.field(default=1, validator=f.positive)
    """The most POSTs of one batch in flight at once, per rank and service."""
    remote_rm_auth_env: tuple[str, ...] = attrs.field(default=(), converter=f.auth_env_names)
    """Names of environment variables, one per ``remote_rm_url``, whose values are sent as
    ``Authorization: Bearer <value>`` to that service (an empty entry: no header). The config
    holds only the names; the values are read on each rank when the rewards are built."""
    reward_weights: tuple[float, ...] | None = attrs.field(default=None, converter=f.weights)
    """One weight per reward, in the order reward_fn, reward_pretrain..., grm_pretrain...,
    remote_rm_url...; the score is their weighted sum. Unset: every weight 1."""
    grm_pretrain: tuple[str, ...] = attrs.field(default=(), converter=f.grm_paths)
    """Generative reward models (causal-LM judges), each served by its own hf engine that sleeps
    outside its call; the parsed verdict is the score (:mod:`lrft.rewards.generative`)."""
    grm_template: str = "pointwise-boxed"
    """The judges' template: a built-in name or a JSON/YAML file
    (:mod:`lrft.rewards.judge_template`)."""
    grm_max_new_tokens: int = attrs.field(default=64, validator=f.positive)
    grm_apply_chat_template: bool = False
    """Wrap each judge prompt in the judge tokenizer's chat template."""
    grm_unparsable_score: float | None = attrs.field(default=None, validator=f.optional_finite)
    """The score of a verdict the template cannot read; unset: the template's."""
    reward_recipes: str | None = None
    """A JSON/YAML file mapping each data label to ``{reward name: weight}``: per-label weighted
    sums instead of ``reward_weights`` (:mod:`lrft.trainer.recipes`)."""
    # rollout ---------------------------------------------------------------------------------
    n_samples_per_prompt: int = attrs.field(default=8, validator=f.positive)
    rollout_batch_size: int = attrs.field(default=32, validator=f.positive)
    micro_rollout_batch_size: int = attrs.field(default=16, validator=f.positive)
    generate_max_len: int = attrs.field(default=1024, validator=f.positive)
    temperature: float = attrs.field(default=1.0, validator=f.positive_float)
    top_p: float = 1.0
    engine_type: str = attrs.field(default="hf", validator=f.engine)
    hf_decode: str = attrs.field(default="auto", validator=f.hf_decode)
    """The hf engine's decoding path (``HFEngineConfig.decode``); ``auto``: cuda_graph on CUDA."""
    engine_tp_size: int = attrs.field(default=1, validator=f.positive)
    engine_mem_util: float | None = attrs.field(default=None, validator=f.optional_fraction)
    """The vllm engine's share of this rank's device memory (vLLM ``gpu_memory_utilization``);
    see :meth:`TrainConfig.engine_memory_share`. Unset: 0.5 of a GPU; on CPU, 0.5 of the host
    split over its ranks. Other engines reserve nothing up front and refuse it."""
    enable_engine_sleep: bool = False
    # multi-turn episodes (lrft.agents) -------------------------------------------------------
    environment: str | None = attrs.field(default=None, validator=f.environment)
    """Roll out multi-turn episodes in this registered environment (``tool_calls``) instead of
    one response per sample: the model's turns are trained on, the observations between them
    are not (docs/multi-turn.md). Unset: single-turn rollouts."""
    environment_options: str | None = attrs.field(default=None, validator=f.json_object)
    """The environment's options as a JSON object (``tool_calls``: ``{"chat_template": false,
    "max_calls_per_turn": 2, ...}``, see docs/multi-turn.md); unset: none (needs
    environment)."""
    tools: tuple[str, ...] = attrs.field(default=(), converter=f.tool_names)
    """The registered tools the environment offers (``calculator``, ``python``)."""
    max_turns: int | None = attrs.field(default=None, validator=f.optional_positive)
    """The most model turns of an episode; unset: 4 (needs environment)."""
    max_episode_tokens: int | None = attrs.field(default=None, validator=f.optional_positive)
    """The most tokens of an episode, prompt, turns and observations together; unset: 1024
    (needs environment). Each turn is also at most ``generate_max_len`` tokens."""
    # training --------------------------------------------------------------------------------
    train_batch_size: int = attrs.field(default=128, validator=f.positive)
    micro_train_batch_size: int = attrs.field(default=16, validator=f.positive)
    max_tokens_per_micro_batch: int | None = attrs.field(
        default=None, validator=f.optional_positive
    )
    """Pack each optimizer step's rows (policy, and critic with ``gae``) into forwards of at most
    this many padded tokens (rows x longest row) instead of ``micro_train_batch_size`` rows; the
    loss is still aggregated over ``micro_train_batch_size``-row groups, so gradients do not
    change. Unset: fixed rows."""
    max_epochs: int = attrs.field(default=1, validator=f.positive)
    num_episodes: int = attrs.field(default=1, validator=f.positive)
    max_steps: int | None = None
    actor_learning_rate: float = attrs.field(default=1e-6, validator=f.positive_float)
    l2: float = attrs.field(default=0.0, validator=f.non_negative)
    max_norm: float = attrs.field(default=1.0, validator=f.non_negative)
    advantage_estimator: str = attrs.field(default="group_norm", validator=f.estimator)
    eps_clip: float = attrs.field(default=0.2, validator=f.positive_float)
    gamma: float | None = attrs.field(default=None, validator=f.optional_unit_interval)
    """Discount per response token, for the estimators that read it (gae, reinforce,
    reinforce++); unset: 1."""
    lambd: float | None = attrs.field(default=None, validator=f.optional_unit_interval)
    """GAE's lambda (gae only); unset: 0.95."""
    critic_pretrain: str | None = None
    """The critic's initial weights: a causal LM folder (its value head starts fresh) or a saved
    critic; unset: ``pretrain``. This and the next two need a value-based estimator."""
    critic_learning_rate: float | None = attrs.field(
        default=None, validator=f.optional_positive_float
    )
    """The critic's AdamW learning rate; unset: 9e-6."""
    value_clip: float | None = attrs.field(default=None, validator=f.optional_non_negative)
    """How far the critic's new values may move from the experience pass's before the value
    loss stops rewarding it (PPO value clipping; 0: off); unset: 0.2."""
    init_kl_coef: float = attrs.field(default=0.0, validator=f.non_negative)
    kl_estimator: str = attrs.field(default="k3", validator=f.kl_estimator)
    use_kl_loss: bool = False
    normalize_reward: bool = False
    # policy loss and sampling algorithms (lrft.algo) ---------------------------------------
    policy_loss_type: str = attrs.field(default="ppo", validator=f.policy_loss)
    """A registered policy loss (``lrft.algo.policy_losses``): ppo, gspo, gmpo, cpgd."""
    eps_clip_low_high: tuple[float, float] | None = attrs.field(default=None, converter=f.clip_pair)
    """Decoupled clip bounds (LOW, HIGH), DAPO's clip-higher; replaces ``eps_clip``."""
    dual_clip: float | None = None
    """Dual-clip PPO's constant ``c > 1``: a negative-advantage token's loss is at most ``-A c``."""
    loss_agg_mode: str | None = attrs.field(default=None, validator=f.aggregation)
    """How token losses become one scalar; unset: token-mean (a sequence-level loss such as
    gspo averages over responses by definition and refuses it)."""
    entropy_loss_coef: float | None = attrs.field(default=None, validator=f.optional_non_negative)
    """Entropy bonus: ``- coef * entropy`` is added to the loss; 0 logs the entropy only; unset:
    the entropy is not computed."""
    high_entropy_token_ratio: float = attrs.field(default=0.0, validator=f.token_ratio)
    """Train only on this top fraction of each micro-batch's tokens by entropy (0: all)."""
    use_tis: bool = False
    """Truncated importance sampling against the engine's own logprobs of the rollout."""
    tis_cap: float | None = attrs.field(default=None, validator=f.optional_positive_float)
    """The truncation of the importance weight ``exp(old - engine)``; unset: 2 (needs use_tis)."""
    overlong_buffer_len: int | None = attrs.field(default=None, validator=f.optional_positive)
    """DAPO's soft overlong punishment over the last N tokens before ``generate_max_len``."""
    overlong_penalty_factor: float | None = attrs.field(
        default=None, validator=f.optional_non_negative
    )
    """The punishment at ``generate_max_len``; unset: 1 (needs overlong_buffer_len)."""
    use_fire_sampling: bool = False
    """FIRE: sample each response's first token at a high temperature, the rest as usual."""
    fire_first_token_temperature: float | None = attrs.field(
        default=None, validator=f.optional_positive_float
    )
    """FIRE's first-token temperature; unset: 10 (needs use_fire_sampling)."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose rewards are all equal and refill the batch."""
    max_num_gen_batches: int | None = attrs.field(default=None, validator=f.optional_positive)
    """Generate rounds per iteration with dynamic_sampling, the first included; unset: 4."""
    gradient_checkpointing: bool = False
    fsdp_cpu_offload: bool = False
    fsdp_reshard_after_forward: bool = True
    """Free each FSDP2 layer's gathered weights after its forward (False: keep them to backward)."""
    fsdp_defer_gradient_sync: bool = False
    """Reduce FSDP2 gradients once per optimizer step instead of once per micro-batch."""
    zero_stage: int | None = attrs.field(default=None, validator=f.zero_stage)
    """Train with DeepSpeed ZeRO at this stage instead of FSDP2 (``None``: FSDP2)."""
    deepspeed_config: str | None = None
    """A DeepSpeed JSON file merged into the generated config (needs ``zero_stage``)."""
    adam_offload: bool = False
    seed: int = 42
    # LoRA (lrft.backends.train.lora) ---------------------------------------------------------
    lora_rank: int = attrs.field(default=0, validator=f.non_negative_int)
    """Train LoRA adapters of this rank on the actor instead of all its weights (0: off; needs
    ``pip install 'lrft[lora]'``). The reference policy is then the actor with its adapters
    disabled, and weight sync sends the merged weights."""
    lora_alpha: int = attrs.field(default=16, validator=f.positive)
    """The adapters' scaling is ``lora_alpha / lora_rank``."""
    lora_dropout: float = attrs.field(default=0.0, validator=f.dropout_probability)
    target_modules: tuple[str, ...] = attrs.field(default=("all-linear",), converter=f.module_names)
    """The modules given adapters: names (or name suffixes) of linear modules, or
    ``all-linear`` (every linear module but the output head)."""
    # on-policy distillation and process rewards ---------------------------------------------
    teacher_pretrain: str | None = None
    """The teacher of on-policy distillation (``--advantage_estimator on_policy_distillation``
    or ``_hybrid``): a causal LM folder sharing the student's tokenizer (a vision-language model
    for a vision-language student), frozen, sharded and offloaded like the reference model."""
    teacher_url: str | None = attrs.field(
        default=None, validator=f.optional_http_url, repr=f.redacted_repr
    )
    """A teacher service instead: per-token logprobs for given token ids, in
    ``teacher_protocol``'s format (:mod:`lrft.distill.protocols`)."""
    teacher_protocol: str = attrs.field(default="lrft", validator=f.teacher_protocol)
    """The teacher service's format: ``lrft``, or ``sglang`` (SGLang's ``/generate``, as
    LightRFT's teacher server speaks it)."""
    teacher_auth_env: str | None = None
    """An environment variable whose value goes to the teacher service as ``Authorization:
    Bearer <value>`` (the config holds the name only)."""
    teacher_timeout_s: float = attrs.field(default=60.0, validator=f.positive_float)
    teacher_max_attempts: int = attrs.field(default=3, validator=f.positive)
    opd_kl_coef: float | None = attrs.field(default=None, validator=f.optional_positive_float)
    """The weight of the distillation advantage ``-coef * clamp(log p_student - log p_teacher,
    ±20)``; unset: 1 (read by the distillation estimators only)."""
    no_task_reward: bool = False
    """Score no training sample with the task reward (on_policy_distillation learns from the
    teacher alone); evaluation still uses the reward when one is given."""
    prm_pretrain: str | None = None
    """A process reward model: a token-classification (or scalar-head) folder sharing the
    student's tokenizer, whose score at each step's end becomes a token reward there
    (``lrft train-rm --step_separator`` trains one)."""
    prm_step_separator: str | None = attrs.field(default=None, validator=f.optional_text)
    """The text that ends each reasoning step of a response (``$'\\n\\n'`` in bash); the last
    step ends with the response (needs ``prm_pretrain``)."""
    # bookkeeping -----------------------------------------------------------------------------
    save_path: str = "./lrft_output"
    ckpt_path: str | None = None
    save_steps: int = attrs.field(default=-1, validator=f.every_n_or_never)
    """Checkpoint every N iterations; -1: never."""
    max_ckpt_num: int = attrs.field(default=3, validator=f.positive)
    load_checkpoint: bool = False
    """Resume from the newest complete checkpoint in ``checkpoint_dir``; its settings must
    match this run's but for :data:`lrft.run.resume.RESUMABLE_SETTINGS`."""
    overwrite_output: bool = False
    """Start a new run over another run's outputs in ``save_path`` and ``checkpoint_dir``,
    removing exactly those outputs first (:mod:`lrft.run.outputs`); without it such a run
    is refused."""
    eval_steps: int = attrs.field(default=-1, validator=f.every_n_or_never)
    """Evaluate every N iterations; -1: at the start and the end only."""
    save_hf_model: bool = True
    use_tensorboard: bool = attrs.field(
        default=attrs.Factory(_tensorboard_default, takes_self=True),
        validator=_tensorboard_installed,
    )
    """Also write the metrics as TensorBoard scalars under ``SAVE_PATH/tensorboard``.

    Needs ``pip install 'lrft[plots]'``. Default: on for the built-in demo and the presets when
    tensorboard is installed, off otherwise.
    """
    use_wandb: bool = attrs.field(default=False, validator=f.wandb_switch)
    """Also log the config and the metrics to Weights & Biases, from rank 0.

    Needs ``pip install 'lrft[wandb]'``. A switch, unlike LightRFT's flag of the same name (which
    takes the API key): wandb reads the key from ``WANDB_API_KEY`` or from ``wandb login``, so it
    never appears in process lists, config files or checkpoint manifests.
    """
    wandb_project: str | None = None
    """The W&B project (unset: ``lrft``). This and the next three need ``use_wandb``."""
    wandb_org: str | None = None
    """The W&B entity (user or team) owning the run; unset: the account's default."""
    wandb_group: str | None = None
    wandb_run_name: str | None = None
    """The run's display name; unset: W&B picks one."""
    progress_bar: bool = True
    """Rank 0 draws a progress bar when its stdout is a terminal; otherwise, or when this is
    off, it prints one line per step."""
    save_trajectories: bool = False
    """Write every sample of each iteration to ``SAVE_PATH/trajectories/step_<k>.jsonl``."""
    save_trajectories_steps: int | None = attrs.field(default=None, validator=f.optional_positive)
    """With ``save_trajectories``: only every N iterations (unset: every iteration)."""
    collective_timeout_s: float = attrs.field(default=600.0, validator=f.positive_float)
    """How long a rank waits at a collective for the slowest rank before it fails with a
    ``CollectiveTimeout`` naming its phase, its step and the other ranks' (exit code 3). It bounds
    what one rank may do while the others wait: a longer generation, a reward service's retries
    (checked), a first compile, the rank that writes the export. A stopped or dead rank is
    reported after half of it (60 s at most), see :mod:`lrft.dist.watchdog`."""
    # the learning-rate schedule and optimizer -----------------------------------------------
    lr_scheduler: str = attrs.field(default="constant", validator=f.lr_scheduler)
    """The learning rate after the warm-up: ``constant``; ``linear`` or ``cosine`` decay to
    ``min_lr_ratio`` x the rate at the run's last optimizer step; ``cosine_with_min_lr``
    (LightRFT's schedule) is cosine with a floor of 0.1 unless ``min_lr_ratio`` gives another.
    Applies to the actor and to the critic."""
    lr_warmup_ratio: float = attrs.field(default=0.0, validator=f.warmup_ratio)
    """The share of the run's optimizer steps over which the rate rises linearly to its value."""
    min_lr_ratio: float | None = attrs.field(default=None, validator=f.optional_unit_interval)
    """The floor of a decaying schedule, as a fraction of the learning rate; unset: 0 (0.1 for
    ``cosine_with_min_lr``)."""
    adam_betas: tuple[float, float] = attrs.field(default=(0.9, 0.999), converter=f.beta_pair)
    """AdamW's (beta1, beta2), for the actor and the critic (LightRFT's default is 0.9 0.95)."""
    # adaptive KL, reward and advantage clipping ----------------------------------------------
    kl_target: float | None = attrs.field(default=None, validator=f.optional_positive_float)
    """Adapt the KL coefficient (starting at ``init_kl_coef``) towards this measured KL per
    token, by the proportional controller of Ziegler et al. 2019
    (:class:`lrft.algo.AdaptiveKLController`); unset: the coefficient stays fixed."""
    kl_horizon: int | None = attrs.field(default=None, validator=f.optional_positive)
    """The controller's horizon in samples: each iteration moves the coefficient by at most
    20% x samples / horizon; unset: 10000 (needs ``kl_target``)."""
    reward_clip: float = attrs.field(default=0.0, validator=f.non_negative)
    """Clip each reward to [-c, c] after shaping and normalisation (0: off)."""
    advantage_clip: float = attrs.field(default=0.0, validator=f.non_negative)
    """Clip each advantage to [-c, c] after the estimator's normalisation (0: off)."""
    # data ------------------------------------------------------------------------------------
    system_prompt: str | None = None
    """A system message put before each prompt's conversation (needs ``apply_chat_template``)."""
    prompt_data_probs: tuple[float, ...] | None = attrs.field(
        default=None, converter=f.probabilities
    )
    """With several comma-separated ``prompt_data`` sources: the share of each in the mixed
    training set (:mod:`lrft.data.mixture`); unset: each source as it is, one after another."""
    prompt_split: str | None = None
    """The split of a ``datasets`` DatasetDict folder to train on; unset: ``train``."""
    eval_split: str | None = None
    """The split held out for evaluation: of ``eval_dataset``, or, with no ``eval_dataset``, of
    ``prompt_data`` (LightRFT's ``--eval_split test``)."""
    # kernels, backends by name, plug-ins -----------------------------------------------------
    attn_implementation: str = attrs.field(default="sdpa", validator=f.attention)
    """The attention kernel of the trained models (actor, reference, critic, reward models):
    transformers' ``sdpa``, ``eager``, or ``flash_attention_2`` (needs the flash-attn package
    and CUDA); LightRFT's ``--flash_attn`` selects ``flash_attention_2``."""
    train_backend: str | None = attrs.field(default=None, validator=f.backend_name("train"))
    """The train backend by registered name (:mod:`lrft.backends.registry`): ``fsdp2``,
    ``deepspeed``, or a package's; unset: ``fsdp2``, or ``deepspeed`` with ``zero_stage``."""
    weight_sync: str = attrs.field(default="direct", validator=f.backend_name("sync"))
    """The weight sync by registered name: ``direct``, or a package's."""
    plugins: tuple[str, ...] = attrs.field(default=(), converter=f.plugin_modules)
    """Python modules ``lrft train`` imports on every rank before it reads the other settings:
    what they register (advantage estimators, policy losses, KL estimators, backends) can then
    be chosen by name."""

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
