"""The trainer's settings: one frozen record, validated whole before any process group starts.

Field names are LightRFT's flag names (``--rollout_batch_size`` is ``rollout_batch_size``), so a
LightRFT command line or config file reads the same here. :func:`TrainConfig.validate_world`
checks the rules that depend on the number of ranks, read from torchrun's environment before
``init_process_group``; everything else is checked at construction. Errors name the value and
the rule.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from lrft.algo import advantage_estimators, kl_estimators
from lrft.api.errors import ConfigError
from lrft.trainer.metrics import PLOTS_EXTRA, tensorboard_available

EngineType = Literal["hf"]
ENGINE_MAX_TP: dict[str, int] = {"hf": 1}
"""The largest tensor-parallel size each built-in engine supports (its ``max_tp`` capability)."""


def supported_estimators() -> tuple[str, ...]:
    """Registered advantage estimators that need no critic (the trainer has none)."""
    return tuple(s.name for s in advantage_estimators if not s.needs_values)


def _positive(_: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{attribute.name} must be a positive integer, got {value!r}")


def _non_negative(_: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ConfigError(f"{attribute.name} must be >= 0, got {value!r}")


def _positive_float(_: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"{attribute.name} must be > 0, got {value!r}")


def _estimator(_: object, attribute: attrs.Attribute[Any], value: str) -> None:
    choices = supported_estimators()
    if value not in choices:
        raise ConfigError(
            f"{attribute.name} {value!r} is not supported by this trainer; choose one of "
            f"{', '.join(choices)} (estimators that need a critic, such as gae, are not available)"
        )


def _kl_estimator(_: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if value not in kl_estimators:
        raise ConfigError(
            f"{attribute.name} {value!r} is unknown; choose one of {', '.join(kl_estimators.names())}"
        )


def _engine(_: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if value not in ENGINE_MAX_TP:
        raise ConfigError(
            f"{attribute.name} {value!r} is unknown; choose one of {list(ENGINE_MAX_TP)}"
        )


def _zero_stage(_: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None and value not in (1, 2, 3):
        raise ConfigError(f"{attribute.name} must be 1, 2 or 3 (or unset for FSDP2), got {value!r}")


def _tensorboard_default(config: TrainConfig) -> bool:
    # The demo promises TensorBoard logs, but tensorboard is optional: on when it is installed.
    return config.pretrain is None and tensorboard_available()


@attrs.frozen(kw_only=True)
class TrainConfig:
    """Everything ``lrft train`` does; see ``lrft train --help`` for each field's meaning."""

    # model and data ------------------------------------------------------------------------
    pretrain: str | None = None
    """A Hugging Face model folder; ``None`` runs the built-in demo (model, data and reward)."""
    prompt_data: str | None = None
    eval_dataset: str | None = None
    input_key: str = "input"
    label_key: str | None = None
    reference_key: str | None = None
    apply_chat_template: bool = False
    input_template: str | None = None
    prompt_max_len: int | None = None
    max_samples: int | None = None
    eval_max_samples: int | None = None
    reward_fn: str | None = None
    """``math`` (math-verify on ``reference_key``) or ``module:function``; demo: exact match."""
    # rollout ---------------------------------------------------------------------------------
    n_samples_per_prompt: int = attrs.field(default=8, validator=_positive)
    rollout_batch_size: int = attrs.field(default=32, validator=_positive)
    micro_rollout_batch_size: int = attrs.field(default=16, validator=_positive)
    generate_max_len: int = attrs.field(default=8, validator=_positive)
    temperature: float = attrs.field(default=1.0, validator=_positive_float)
    top_p: float = 1.0
    engine_type: str = attrs.field(default="hf", validator=_engine)
    engine_tp_size: int = attrs.field(default=1, validator=_positive)
    enable_engine_sleep: bool = False
    # training --------------------------------------------------------------------------------
    train_batch_size: int = attrs.field(default=128, validator=_positive)
    micro_train_batch_size: int = attrs.field(default=16, validator=_positive)
    max_epochs: int = attrs.field(default=1, validator=_positive)
    num_episodes: int = attrs.field(default=1, validator=_positive)
    max_steps: int | None = None
    actor_learning_rate: float = attrs.field(default=1e-6, validator=_positive_float)
    l2: float = attrs.field(default=0.0, validator=_non_negative)
    max_norm: float = attrs.field(default=1.0, validator=_non_negative)
    advantage_estimator: str = attrs.field(default="group_norm", validator=_estimator)
    eps_clip: float = attrs.field(default=0.2, validator=_positive_float)
    init_kl_coef: float = attrs.field(default=0.0, validator=_non_negative)
    kl_estimator: str = attrs.field(default="k3", validator=_kl_estimator)
    use_kl_loss: bool = False
    normalize_reward: bool = False
    gradient_checkpointing: bool = False
    fsdp_cpu_offload: bool = False
    zero_stage: int | None = attrs.field(default=None, validator=_zero_stage)
    """Train with DeepSpeed ZeRO at this stage instead of FSDP2 (``None``: FSDP2)."""
    deepspeed_config: str | None = None
    """A DeepSpeed JSON file merged into the generated config (needs ``zero_stage``)."""
    adam_offload: bool = False
    seed: int = 42
    # bookkeeping -----------------------------------------------------------------------------
    save_path: str = "./lrft_output"
    ckpt_path: str | None = None
    save_steps: int = -1
    max_ckpt_num: int = attrs.field(default=3, validator=_positive)
    load_checkpoint: bool = False
    eval_steps: int = -1
    save_hf_model: bool = True
    use_tensorboard: bool = attrs.field(
        default=attrs.Factory(_tensorboard_default, takes_self=True)
    )
    """Also write the metrics as TensorBoard scalars under ``SAVE_PATH/tensorboard``.

    Needs ``pip install 'lrft[plots]'``. Default: on for the built-in demo when tensorboard is
    installed, off otherwise.
    """
    collective_timeout_s: float = attrs.field(default=600.0, validator=_positive_float)

    def __attrs_post_init__(self) -> None:
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(
                f"max_steps must be a positive integer or unset, got {self.max_steps!r}"
            )
        if self.pretrain is not None and self.prompt_data is None:
            raise ConfigError("pretrain needs prompt_data (only the built-in demo brings its own)")
        if self.pretrain is not None and self.reward_fn is None:
            raise ConfigError("pretrain needs reward_fn (math, or module:function)")
        if self.reward_fn not in (None, "math") and ":" not in str(self.reward_fn):
            raise ConfigError(f"reward_fn {self.reward_fn!r} must be 'math' or 'module:function'")
        if self.use_kl_loss and self.init_kl_coef == 0.0:
            raise ConfigError("use_kl_loss needs init_kl_coef > 0 (the KL term's coefficient)")
        if self.zero_stage is not None and self.fsdp_cpu_offload:
            raise ConfigError(
                f"fsdp_cpu_offload is an FSDP2 setting, but zero_stage={self.zero_stage} "
                "trains with DeepSpeed: choose one"
            )
        if self.deepspeed_config is not None and self.zero_stage is None:
            raise ConfigError(
                f"deepspeed_config {self.deepspeed_config!r} needs zero_stage (1, 2 or 3): "
                "without it lrft trains with FSDP2"
            )
        if self.fsdp_cpu_offload and self.adam_offload:
            raise ConfigError(
                "adam_offload moves optimizer state to the host between phases, but "
                "fsdp_cpu_offload already keeps it there for the whole run: choose one"
            )
        samples = self.rollout_batch_size * self.n_samples_per_prompt
        if samples % self.train_batch_size:
            raise ConfigError(
                f"train_batch_size {self.train_batch_size} must divide rollout_batch_size * "
                f"n_samples_per_prompt = {self.rollout_batch_size} * {self.n_samples_per_prompt} "
                f"= {samples} (train_batch_size <= rollout_batch_size * n_samples_per_prompt, "
                f"and a whole number of optimizer steps per rollout)"
            )
        if (
            self.n_samples_per_prompt < 2
            and advantage_estimators.get(self.advantage_estimator).needs_groups
        ):
            raise ConfigError(
                f"advantage_estimator {self.advantage_estimator!r} compares the responses to one "
                f"prompt: n_samples_per_prompt must be >= 2, got {self.n_samples_per_prompt}"
            )
        if self.use_tensorboard and not tensorboard_available():
            raise ConfigError(
                f"use_tensorboard needs the tensorboard package, which is not installed: "
                f"{PLOTS_EXTRA}"
            )
        max_tp = ENGINE_MAX_TP[self.engine_type]
        if self.engine_tp_size > max_tp:
            raise ConfigError(
                f"engine_tp_size {self.engine_tp_size} exceeds engine {self.engine_type!r}'s "
                f"maximum tensor-parallel size {max_tp}"
            )

    @property
    def checkpoint_dir(self) -> str:
        return self.ckpt_path if self.ckpt_path is not None else f"{self.save_path}/checkpoints"

    @property
    def samples_per_rollout(self) -> int:
        return self.rollout_batch_size * self.n_samples_per_prompt

    def validate_world(self, world_size: int) -> None:
        """The rules that depend on the number of ranks; raises ``ConfigError`` naming each."""
        if world_size % self.engine_tp_size:
            raise ConfigError(
                f"world size {world_size} is not divisible by engine_tp_size "
                f"{self.engine_tp_size} (world_size % engine_tp_size must be 0)"
            )
        if self.rollout_batch_size % world_size:
            raise ConfigError(
                f"rollout_batch_size {self.rollout_batch_size} is not divisible by world size "
                f"{world_size} (each rank rolls out an equal share of the prompts)"
            )
        per_rank = self.train_batch_size // world_size
        if self.train_batch_size % world_size or per_rank % self.micro_train_batch_size:
            raise ConfigError(
                f"train_batch_size {self.train_batch_size} must equal world size {world_size} x "
                f"micro_train_batch_size {self.micro_train_batch_size} x an integer (gradient "
                f"accumulation steps)"
            )

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)
