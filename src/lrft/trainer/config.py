"""The trainer's settings: one frozen record, validated whole before any process group starts.

Field names are LightRFT's flag names (``--rollout_batch_size`` is ``rollout_batch_size``), so a
LightRFT command line or config file reads the same here. :func:`TrainConfig.validate_world`
checks the rules that depend on the number of ranks, read from torchrun's environment before
``init_process_group``; everything else is checked at construction. Errors name the value and
the rule.
"""

from __future__ import annotations

import importlib.util
import math
import os
import urllib.parse
from collections.abc import Mapping
from typing import Any, Literal, cast

import attrs
import torch

from lrft.algo import (
    AGGREGATION_MODES,
    AdvantageParams,
    AggregationMode,
    PolicyLossConfig,
    PolicyLossInputs,
    advantage_estimators,
    kl_estimators,
    policy_losses,
)
from lrft.api.errors import ConfigError
from lrft.presets import PRESET_NAMES
from lrft.trainer.metrics import PLOTS_EXTRA, tensorboard_available
from lrft.trainer.wandb_metrics import WANDB_EXTRA, wandb_available

EngineType = Literal["hf", "vllm"]
ENGINE_MAX_TP: dict[str, int | None] = {"hf": 1, "vllm": None}
"""The largest tensor-parallel size each built-in engine supports (its ``max_tp`` capability);
``None``: any size that divides the world size."""
VLLM_EXTRA = "pip install 'lrft[vllm]'"
DEFAULT_ENGINE_MEM_UTIL = 0.5
"""The vllm engine's share of a device when ``engine_mem_util`` is unset (LightRFT's default):
the other half stays with training."""
CPU_KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
"""vLLM's CPU KV-cache size in GiB; when set, vLLM 0.32 never reads ``gpu_memory_utilization``."""


def vllm_available() -> bool:
    """Whether vllm is installed (looked up, not imported: importing vllm takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


CRITIC_SETTINGS = ("critic_pretrain", "critic_learning_rate", "value_clip")
"""The fields that configure the critic, which only value-based estimators (gae) train."""
DEFAULT_GAMMA = 1.0
DEFAULT_LAMBD = 0.95
DEFAULT_CRITIC_LEARNING_RATE = 9e-6
DEFAULT_VALUE_CLIP = 0.2


def supported_estimators() -> tuple[str, ...]:
    """Every registered advantage estimator; value-based ones (``needs_values``) get a critic."""
    return advantage_estimators.names()


def value_based_estimators() -> tuple[str, ...]:
    """The registered estimators that read critic values: with them the trainer trains a critic."""
    return tuple(s.name for s in advantage_estimators if s.needs_values)


def _positive(_: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{attribute.name} must be a positive integer, got {value!r}")


def _non_negative(_: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ConfigError(f"{attribute.name} must be >= 0, got {value!r}")


def _positive_float(_: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"{attribute.name} must be > 0, got {value!r}")


def _optional_non_negative(_: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    if value is not None:
        _non_negative(_, attribute, value)


def _optional_positive_float(
    _: object, attribute: attrs.Attribute[Any], value: float | None
) -> None:
    if value is not None:
        _positive_float(_, attribute, value)


def _optional_unit_interval(
    _: object, attribute: attrs.Attribute[Any], value: float | None
) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        raise ConfigError(f"{attribute.name} must be in [0, 1], got {value!r}")


def _optional_fraction(_: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 < value <= 1.0:
        raise ConfigError(f"{attribute.name} must be in (0, 1], got {value!r}")


def _estimator(_: object, attribute: attrs.Attribute[Any], value: str) -> None:
    choices = supported_estimators()
    if value not in choices:
        raise ConfigError(
            f"{attribute.name} {value!r} is unknown; choose one of {', '.join(choices)}"
        )


DEFAULT_TIS_CAP = 2.0
DEFAULT_OVERLONG_PENALTY_FACTOR = 1.0
DEFAULT_FIRE_TEMPERATURE = 10.0
DEFAULT_MAX_NUM_GEN_BATCHES = 4
ALGORITHM_SETTINGS = (
    ("tis_cap", "use_tis"),
    ("overlong_penalty_factor", "overlong_buffer_len"),
    ("fire_first_token_temperature", "use_fire_sampling"),
    ("max_num_gen_batches", "dynamic_sampling"),
)
"""(setting, the switch it needs): each setting is read only when its switch is on."""


def _policy_loss(_: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if value not in policy_losses:
        raise ConfigError(
            f"{attribute.name} {value!r} is unknown; choose one of {', '.join(policy_losses.names())}"
        )


def _aggregation(_: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None and value not in AGGREGATION_MODES:
        raise ConfigError(
            f"{attribute.name} {value!r} is unknown; choose one of {', '.join(AGGREGATION_MODES)}"
        )


def _optional_pair(value: object) -> tuple[float, float] | None:
    if value is None:
        return None
    numbers = (
        isinstance(value, list | tuple)
        and len(value) == 2
        and all(isinstance(x, int | float) and not isinstance(x, bool) for x in value)
    )
    if not numbers:
        raise ConfigError(f"eps_clip_low_high must be two numbers LOW HIGH, got {value!r}")
    assert isinstance(value, list | tuple)
    return (float(value[0]), float(value[1]))


def _optional_at_least_0(_: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    if value is not None:
        _non_negative(_, attribute, value)


def _optional_above_0(_: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    if value is not None:
        _positive_float(_, attribute, value)


def _optional_count(_: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None:
        _positive(_, attribute, value)


def _token_ratio(_: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value < 1.0:
        raise ConfigError(
            f"{attribute.name} must be in [0, 1) (the top fraction of tokens kept; 0 keeps "
            f"all), got {value!r}"
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


def _optional_positive(_: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None:
        _positive(_, attribute, value)


WANDB_SETTINGS = ("wandb_project", "wandb_org", "wandb_group", "wandb_run_name")
"""The fields that say where the W&B run goes; each needs ``use_wandb``."""


def _wandb_switch(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    # LightRFT passes the API key in this flag; a config file copied from it would make a
    # truthy string here. Refuse it without echoing it: it is a secret.
    if not isinstance(value, bool):
        raise ConfigError(
            f"{attribute.name} must be true or false, got a {type(value).__name__}; lrft reads "
            "the W&B API key from the WANDB_API_KEY environment variable (or `wandb login`), "
            "never from its configuration"
        )


def _items(value: str | list[str] | tuple[str, ...] | None, name: str) -> tuple[str, ...]:
    """A comma-separated string (LightRFT's form) or a list, as a tuple of stripped items."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    stripped = tuple(str(item).strip() for item in items)
    if any(not item for item in stripped):
        raise ConfigError(
            f"{name} {value!r} has an empty entry; separate entries with single commas"
        )
    return stripped


def _reward_paths(value: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    return _items(value, "reward_pretrain")


def _reward_urls(value: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    return _items(value, "remote_rm_url")


def _weights(value: str | list[float] | tuple[float, ...] | None) -> tuple[float, ...] | None:
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    try:
        weights = tuple(float(item) for item in items)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"reward_weights {value!r} must be numbers: {error}") from error
    if not weights or not all(math.isfinite(w) for w in weights):
        raise ConfigError(f"reward_weights {value!r} must be one or more finite numbers")
    return weights


def _preset(_: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None and value not in PRESET_NAMES:
        raise ConfigError(
            f"{attribute.name} {value!r} is unknown; choose one of {list(PRESET_NAMES)}"
        )


def _http_urls(_: object, attribute: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    for url in value:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"{attribute.name} entry {url!r} must be an http:// or https:// URL")


def _tensorboard_default(config: TrainConfig) -> bool:
    # The demo and the presets promise TensorBoard logs, but tensorboard is optional: on when it
    # is installed.
    built_in = config.pretrain is None or config.preset is not None
    return built_in and tensorboard_available()


@attrs.frozen(kw_only=True)
class TrainConfig:
    """Everything ``lrft train`` does; see ``lrft train --help`` for each field's meaning."""

    # model and data ------------------------------------------------------------------------
    pretrain: str | None = None
    """A Hugging Face model folder; ``None`` runs the built-in demo (model, data and reward),
    or with ``preset`` the preset's model."""
    preset: str | None = attrs.field(default=None, validator=_preset)
    """A built-in job on a real model (``smollm2``): its model, data, reward and settings fill
    in whatever is left unset (see :mod:`lrft.trainer.presets`)."""
    cache_dir: str | None = None
    """Where presets keep converted models; unset: ``$XDG_CACHE_HOME/lrft`` (``~/.cache/lrft``)."""
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
    reward_pretrain: tuple[str, ...] = attrs.field(default=(), converter=_reward_paths)
    """Scalar reward models (``*ForSequenceClassification`` folders with one label), scoring
    prompt + response; given as a list or LightRFT's comma-separated string."""
    remote_rm_url: tuple[str, ...] = attrs.field(
        default=(), converter=_reward_urls, validator=_http_urls
    )
    """Reward services (JSON over HTTP, see :mod:`lrft.rewards.remote`), one POST per batch."""
    remote_rm_timeout_s: float = attrs.field(default=30.0, validator=_positive_float)
    remote_rm_max_attempts: int = attrs.field(default=3, validator=_positive)
    reward_weights: tuple[float, ...] | None = attrs.field(default=None, converter=_weights)
    """One weight per reward, in the order reward_fn, reward_pretrain..., remote_rm_url...; the
    score is their weighted sum. Unset: every weight 1."""
    # rollout ---------------------------------------------------------------------------------
    n_samples_per_prompt: int = attrs.field(default=8, validator=_positive)
    rollout_batch_size: int = attrs.field(default=32, validator=_positive)
    micro_rollout_batch_size: int = attrs.field(default=16, validator=_positive)
    generate_max_len: int = attrs.field(default=8, validator=_positive)
    temperature: float = attrs.field(default=1.0, validator=_positive_float)
    top_p: float = 1.0
    engine_type: str = attrs.field(default="hf", validator=_engine)
    engine_tp_size: int = attrs.field(default=1, validator=_positive)
    engine_mem_util: float | None = attrs.field(default=None, validator=_optional_fraction)
    """The vllm engine's share of this rank's device memory (vLLM ``gpu_memory_utilization``);
    see :meth:`engine_memory_share`. Unset: 0.5 of a GPU; on CPU, 0.5 of the host split over
    its ranks. Other engines reserve nothing up front and refuse it."""
    enable_engine_sleep: bool = False
    # training --------------------------------------------------------------------------------
    train_batch_size: int = attrs.field(default=128, validator=_positive)
    micro_train_batch_size: int = attrs.field(default=16, validator=_positive)
    max_tokens_per_micro_batch: int | None = attrs.field(default=None, validator=_optional_positive)
    """Pack each optimizer step's rows into forwards of at most this many padded tokens (rows x
    longest row) instead of ``micro_train_batch_size`` rows; the loss is still aggregated over
    ``micro_train_batch_size``-row groups, so gradients do not change. Unset: fixed rows."""
    max_epochs: int = attrs.field(default=1, validator=_positive)
    num_episodes: int = attrs.field(default=1, validator=_positive)
    max_steps: int | None = None
    actor_learning_rate: float = attrs.field(default=1e-6, validator=_positive_float)
    l2: float = attrs.field(default=0.0, validator=_non_negative)
    max_norm: float = attrs.field(default=1.0, validator=_non_negative)
    advantage_estimator: str = attrs.field(default="group_norm", validator=_estimator)
    eps_clip: float = attrs.field(default=0.2, validator=_positive_float)
    gamma: float | None = attrs.field(default=None, validator=_optional_unit_interval)
    """Discount per response token, for the estimators that read it (gae, reinforce,
    reinforce++); unset: 1."""
    lambd: float | None = attrs.field(default=None, validator=_optional_unit_interval)
    """GAE's lambda (gae only); unset: 0.95."""
    critic_pretrain: str | None = None
    """The critic's initial weights: a causal LM folder (its value head starts fresh) or a saved
    critic; unset: ``pretrain``. This and the next two need a value-based estimator."""
    critic_learning_rate: float | None = attrs.field(
        default=None, validator=_optional_positive_float
    )
    """The critic's AdamW learning rate; unset: 9e-6."""
    value_clip: float | None = attrs.field(default=None, validator=_optional_non_negative)
    """How far the critic's new values may move from the experience pass's before the value
    loss stops rewarding it (PPO value clipping; 0: off); unset: 0.2."""
    init_kl_coef: float = attrs.field(default=0.0, validator=_non_negative)
    kl_estimator: str = attrs.field(default="k3", validator=_kl_estimator)
    use_kl_loss: bool = False
    normalize_reward: bool = False
    # policy loss and sampling algorithms (lrft.algo) ---------------------------------------
    policy_loss_type: str = attrs.field(default="ppo", validator=_policy_loss)
    """A registered policy loss (``lrft.algo.policy_losses``): ppo, gspo, gmpo, cpgd."""
    eps_clip_low_high: tuple[float, float] | None = attrs.field(
        default=None, converter=_optional_pair
    )
    """Decoupled clip bounds (LOW, HIGH), DAPO's clip-higher; replaces ``eps_clip``."""
    dual_clip: float | None = None
    """Dual-clip PPO's constant ``c > 1``: a negative-advantage token's loss is at most ``-A c``."""
    loss_agg_mode: str | None = attrs.field(default=None, validator=_aggregation)
    """How token losses become one scalar; unset: token-mean (a sequence-level loss such as
    gspo averages over responses by definition and refuses it)."""
    entropy_loss_coef: float | None = attrs.field(default=None, validator=_optional_at_least_0)
    """Entropy bonus: ``- coef * entropy`` is added to the loss; 0 logs the entropy only; unset:
    the entropy is not computed."""
    high_entropy_token_ratio: float = attrs.field(default=0.0, validator=_token_ratio)
    """Train only on this top fraction of each micro-batch's tokens by entropy (0: all)."""
    use_tis: bool = False
    """Truncated importance sampling against the engine's own logprobs of the rollout."""
    tis_cap: float | None = attrs.field(default=None, validator=_optional_above_0)
    """The truncation of the importance weight ``exp(old - engine)``; unset: 2 (needs use_tis)."""
    overlong_buffer_len: int | None = attrs.field(default=None, validator=_optional_count)
    """DAPO's soft overlong punishment over the last N tokens before ``generate_max_len``."""
    overlong_penalty_factor: float | None = attrs.field(
        default=None, validator=_optional_at_least_0
    )
    """The punishment at ``generate_max_len``; unset: 1 (needs overlong_buffer_len)."""
    use_fire_sampling: bool = False
    """FIRE: sample each response's first token at a high temperature, the rest as usual."""
    fire_first_token_temperature: float | None = attrs.field(
        default=None, validator=_optional_above_0
    )
    """FIRE's first-token temperature; unset: 10 (needs use_fire_sampling)."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose rewards are all equal and refill the batch."""
    max_num_gen_batches: int | None = attrs.field(default=None, validator=_optional_count)
    """Generate rounds per iteration with dynamic_sampling, the first included; unset: 4."""
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

    Needs ``pip install 'lrft[plots]'``. Default: on for the built-in demo and the presets when
    tensorboard is installed, off otherwise.
    """
    use_wandb: bool = attrs.field(default=False, validator=_wandb_switch)
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
    save_trajectories_steps: int | None = attrs.field(default=None, validator=_optional_positive)
    """With ``save_trajectories``: only every N iterations (unset: every iteration)."""
    collective_timeout_s: float = attrs.field(default=600.0, validator=_positive_float)

    def __attrs_post_init__(self) -> None:
        if self.max_tokens_per_micro_batch is not None and self.high_entropy_token_ratio > 0:
            raise ConfigError(
                f"high_entropy_token_ratio {self.high_entropy_token_ratio} selects tokens within "
                "each micro-batch, which max_tokens_per_micro_batch repacks: set one of them"
            )
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(
                f"max_steps must be a positive integer or unset, got {self.max_steps!r}"
            )
        if self.pretrain is not None and self.prompt_data is None and self.preset is None:
            raise ConfigError(
                "pretrain needs prompt_data (only the built-in demo and presets bring their own)"
            )
        self._check_reward_settings()
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
        self._check_estimator_settings()
        self._check_algorithm_settings()
        if self.use_tensorboard and not tensorboard_available():
            raise ConfigError(
                f"use_tensorboard needs the tensorboard package, which is not installed: "
                f"{PLOTS_EXTRA}"
            )
        self._check_observability_settings()
        max_tp = ENGINE_MAX_TP[self.engine_type]
        if max_tp is not None and self.engine_tp_size > max_tp:
            raise ConfigError(
                f"engine_tp_size {self.engine_tp_size} exceeds engine {self.engine_type!r}'s "
                f"maximum tensor-parallel size {max_tp}"
            )
        self._check_engine_settings()

    def _check_engine_settings(self) -> None:
        if self.engine_type == "vllm" and not vllm_available():
            raise ConfigError(
                f"engine_type 'vllm' needs the vllm package, which is not installed: {VLLM_EXTRA}"
            )
        if self.engine_mem_util is not None and self.engine_type != "vllm":
            raise ConfigError(
                f"engine_mem_util {self.engine_mem_util} sizes the memory the vllm engine reserves "
                f"up front; engine {self.engine_type!r} reserves none (it allocates as it "
                "generates): leave engine_mem_util unset or use engine_type vllm"
            )

    def _check_estimator_settings(self) -> None:
        """No setting the chosen estimator would ignore: critic settings need a critic, and
        ``gamma``/``lambd`` need an estimator that reads them."""
        spec = advantage_estimators.get(self.advantage_estimator)
        if not spec.needs_values:
            for name in CRITIC_SETTINGS:
                if getattr(self, name) is not None:
                    raise ConfigError(
                        f"{name} configures the critic, but advantage_estimator "
                        f"{self.advantage_estimator!r} trains none: critic settings need a "
                        f"value-based estimator ({', '.join(value_based_estimators())})"
                    )
        for name in ("gamma", "lambd"):
            if getattr(self, name) is not None and name not in spec.reads:
                readers = [s.name for s in advantage_estimators if name in s.reads]
                raise ConfigError(
                    f"{name} is read only by the advantage estimators {', '.join(readers)}; "
                    f"advantage_estimator {self.advantage_estimator!r} does not use it"
                )

    def _check_observability_settings(self) -> None:
        if self.use_wandb and not wandb_available():
            raise ConfigError(
                f"use_wandb needs the wandb package, which is not installed: {WANDB_EXTRA}"
            )
        if not self.use_wandb:
            for name in WANDB_SETTINGS:
                if getattr(self, name) is not None:
                    raise ConfigError(
                        f"{name} {getattr(self, name)!r} needs use_wandb (without it nothing "
                        "is logged to W&B)"
                    )
        if self.save_trajectories_steps is not None and not self.save_trajectories:
            raise ConfigError(
                f"save_trajectories_steps {self.save_trajectories_steps} needs save_trajectories "
                "(without it no trajectory is saved)"
            )

    @property
    def reward_count(self) -> int:
        """How many rewards are combined: reward_fn, each reward model, each remote service."""
        return (self.reward_fn is not None) + len(self.reward_pretrain) + len(self.remote_rm_url)

    def _check_reward_settings(self) -> None:
        if self.pretrain is not None and self.preset is None and self.reward_count == 0:
            raise ConfigError(
                "pretrain needs a reward: reward_fn (math, or module:function), "
                "reward_pretrain or remote_rm_url"
            )
        if self.reward_fn not in (None, "math") and ":" not in str(self.reward_fn):
            raise ConfigError(f"reward_fn {self.reward_fn!r} must be 'math' or 'module:function'")
        if self.pretrain is None and self.preset is None and self.reward_count:
            raise ConfigError(
                "the built-in demo brings its own reward; reward_fn, reward_pretrain and "
                "remote_rm_url need --pretrain or --preset"
            )
        if not self.remote_rm_url:
            defaults = attrs.fields_dict(TrainConfig)
            for name in ("remote_rm_timeout_s", "remote_rm_max_attempts"):
                if getattr(self, name) != defaults[name].default:
                    raise ConfigError(f"{name} applies to remote_rm_url, which is not set")
        if self.reward_weights is not None and len(self.reward_weights) != self.reward_count:
            raise ConfigError(
                f"reward_weights has {len(self.reward_weights)} entries for {self.reward_count} "
                f"rewards (reward_fn, then each reward_pretrain, then each remote_rm_url): give "
                f"one weight per reward"
            )
        if self.cache_dir is not None and self.preset is None:
            raise ConfigError(
                f"cache_dir {self.cache_dir!r} is where presets keep converted models; "
                "it needs --preset"
            )

    @property
    def checkpoint_dir(self) -> str:
        return self.ckpt_path if self.ckpt_path is not None else f"{self.save_path}/checkpoints"

    @property
    def samples_per_rollout(self) -> int:
        return self.rollout_batch_size * self.n_samples_per_prompt

    @property
    def uses_critic(self) -> bool:
        """Whether the estimator reads critic values, so that a critic is trained."""
        return advantage_estimators.get(self.advantage_estimator).needs_values

    @property
    def advantage_params(self) -> AdvantageParams:
        """The estimator's parameters, with the defaults for ``gamma`` and ``lambd`` when unset."""
        return AdvantageParams(
            gamma=DEFAULT_GAMMA if self.gamma is None else self.gamma,
            lambd=DEFAULT_LAMBD if self.lambd is None else self.lambd,
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

    def _check_algorithm_settings(self) -> None:
        """No policy-loss or sampling setting that would be ignored or that the loss refuses."""
        for setting, switch in ALGORITHM_SETTINGS:
            if getattr(self, setting) is not None and not getattr(self, switch):
                raise ConfigError(
                    f"{setting} {getattr(self, setting)!r} is read only with {switch}; "
                    f"set {switch} or leave {setting} unset"
                )
        if self.eps_clip_low_high is not None:
            low, high = self.eps_clip_low_high
            if not 0.0 < low < 1.0 or not 0.0 < high < float("inf"):
                raise ConfigError(
                    f"eps_clip_low_high ({low}, {high}): LOW must be in (0, 1) and HIGH > 0 "
                    f"(the ratio is clipped to [1 - LOW, 1 + HIGH])"
                )
            if self.eps_clip != attrs.fields(TrainConfig).eps_clip.default:
                raise ConfigError(
                    f"eps_clip {self.eps_clip} and eps_clip_low_high {self.eps_clip_low_high} are "
                    "both set, but eps_clip_low_high replaces eps_clip: set one"
                )
        spec = policy_losses.get(self.policy_loss_type)
        token_level = {
            "loss_agg_mode": self.loss_agg_mode is not None,
            "high_entropy_token_ratio": self.high_entropy_token_ratio > 0,
        }
        for name, is_set in token_level.items():
            if is_set and spec.sequence_level:
                raise ConfigError(
                    f"{name} applies to token-level losses, but policy_loss_type "
                    f"{self.policy_loss_type!r} is sequence-level (one ratio per response, "
                    f"averaged over responses): leave {name} unset"
                )
        if (
            self.overlong_buffer_len is not None
            and self.overlong_buffer_len > self.generate_max_len
        ):
            raise ConfigError(
                f"overlong_buffer_len {self.overlong_buffer_len} exceeds generate_max_len "
                f"{self.generate_max_len} (the buffer is the last tokens before that limit)"
            )
        if self.dynamic_sampling and self.n_samples_per_prompt < 2:
            raise ConfigError(
                f"dynamic_sampling drops prompts whose responses all score the same, which needs "
                f"n_samples_per_prompt >= 2, got {self.n_samples_per_prompt}"
            )
        self._try_policy_loss()

    def _try_policy_loss(self) -> None:
        # A loss refuses the settings it does not read (a dual clip for gspo, say) only when it is
        # called; one call on a one-token batch moves that error here, before any process starts,
        # for losses registered by users as well.
        one = torch.zeros(1, 1)
        inputs = PolicyLossInputs(
            logprobs=one,
            old_logprobs=one,
            advantages=one,
            action_mask=torch.ones(1, 1, dtype=torch.bool),
            engine_logprobs=one if self.use_tis else None,
        )
        loss = policy_losses.get(self.policy_loss_type).fn
        try:
            loss(inputs, self.policy_loss_config())
        except ConfigError as error:
            raise ConfigError(f"policy_loss_type {self.policy_loss_type!r}: {error}") from error

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

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)
