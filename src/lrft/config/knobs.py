"""The rules of the settings that shape the optimizer's schedule, the KL coefficient's control,
reward and advantage clipping, the prompt mix, the attention kernel and the backends chosen by
name (:class:`lrft.config.TrainConfig` runs them at construction, after
:mod:`lrft.config.checks`).

Each error names the values and the rule; a setting that would change nothing is refused.
"""

from __future__ import annotations

import importlib.util
import os
import re

import torch

from lrft.api.errors import ConfigError
from lrft.config.fields import TrainFields
from lrft.config.problems import reporting

DEFAULT_KL_HORIZON = 10_000
"""The adaptive KL controller's horizon in samples when ``kl_horizon`` is unset (LightRFT's)."""
CHECKPOINT_NAME = re.compile(r"global_step\d+")
"""The name of one checkpoint's folder (:mod:`lrft.run.checkpoint`)."""
FLASH_ATTENTION_EXTRA = "pip install flash-attn (CUDA only)"
FSDP2_SETTINGS = ("fsdp_cpu_offload", "fsdp_reshard_after_forward", "fsdp_defer_gradient_sync")
"""The settings of lrft's ``fsdp2`` backend (each refused with another train backend)."""


def prompt_sources(prompt_data: str | None) -> tuple[str, ...]:
    """The training prompt sources: ``prompt_data``'s comma-separated paths (LightRFT's form)."""
    if prompt_data is None:
        return ()
    return tuple(part.strip() for part in prompt_data.split(",") if part.strip())


def check_knob_settings(config: TrainFields) -> None:
    """See the module docstring; every rule is checked, and what they find reported together."""
    with reporting() as problems:
        problems.check_each(
            (
                _check_schedule,
                _check_checkpoint_path,
                _check_kl_control,
                _check_data,
                _check_attention,
                _check_train_backend,
            ),
            config,
        )


def _check_schedule(config: TrainFields) -> None:
    if config.min_lr_ratio is not None and config.lr_scheduler == "constant":
        raise ConfigError(
            f"min_lr_ratio {config.min_lr_ratio} is the floor of a decaying schedule, but "
            "lr_scheduler is 'constant': set lr_scheduler linear, cosine or cosine_with_min_lr"
        )


def _check_checkpoint_path(config: TrainFields) -> None:
    if config.ckpt_path is None or config.load_checkpoint:
        return
    if CHECKPOINT_NAME.fullmatch(os.path.basename(config.ckpt_path.rstrip("/"))):
        raise ConfigError(
            f"ckpt_path {config.ckpt_path!r} names one checkpoint, which only a resume reads: "
            "add --load_checkpoint, or give the folder a new run writes its checkpoints into"
        )


def _check_kl_control(config: TrainFields) -> None:
    if config.kl_target is None:
        if config.kl_horizon is not None:
            raise ConfigError(
                f"kl_horizon {config.kl_horizon} is the adaptive KL controller's; it needs "
                "kl_target (without it the coefficient stays at init_kl_coef)"
            )
        return
    if config.init_kl_coef == 0.0:
        raise ConfigError(
            f"kl_target {config.kl_target} adapts the KL coefficient, which starts at "
            "init_kl_coef: set init_kl_coef > 0 (0 trains no reference model)"
        )
    horizon = DEFAULT_KL_HORIZON if config.kl_horizon is None else config.kl_horizon
    samples = config.rollout_batch_size * config.n_samples_per_prompt
    if samples > horizon:
        raise ConfigError(
            f"kl_horizon {horizon} must be >= the {samples} samples of one iteration "
            f"(rollout_batch_size x n_samples_per_prompt): the controller moves the coefficient "
            "by samples / horizon of its error per update, at most one horizon at a time"
        )


def _check_data(config: TrainFields) -> None:
    if config.system_prompt is not None and not config.apply_chat_template:
        raise ConfigError(
            "system_prompt needs apply_chat_template (the system message is part of the chat "
            "template's conversation; without it write the text into input_template)"
        )
    sources = prompt_sources(config.prompt_data)
    probs = config.prompt_data_probs
    if probs is not None and len(sources) < 2:
        raise ConfigError(
            f"prompt_data_probs weights several comma-separated prompt_data sources, but "
            f"{len(sources)} is given: there is nothing to mix"
        )
    if probs is not None and len(probs) != len(sources):
        raise ConfigError(
            f"prompt_data_probs has {len(probs)} entries for {len(sources)} prompt_data "
            "sources: give one probability per source, in order"
        )
    if config.prompt_split is not None and config.prompt_data is None:
        raise ConfigError(
            f"prompt_split {config.prompt_split!r} picks a split of prompt_data, which is not "
            "set (the built-in demo and presets bring their own files)"
        )
    if config.eval_split is None or config.eval_dataset is not None:
        return
    if config.prompt_data is None:
        raise ConfigError(
            f"eval_split {config.eval_split!r} picks a split of eval_dataset, or of prompt_data "
            "without one; neither is set"
        )
    # LightRFT's form: held-out prompts from another split of the training source
    if len(sources) != 1:
        raise ConfigError(
            f"eval_split {config.eval_split!r} without eval_dataset picks a split of "
            f"prompt_data, which names {len(sources)} sources: give eval_dataset"
        )
    train_split = "train" if config.prompt_split is None else config.prompt_split
    if config.eval_split == train_split:
        raise ConfigError(
            f"eval_split {config.eval_split!r} is the split training reads from prompt_data: "
            "held-out prompts must come from another split"
        )


def _check_attention(config: TrainFields) -> None:
    if config.attn_implementation != "flash_attention_2":
        return
    if importlib.util.find_spec("flash_attn") is None:
        raise ConfigError(
            "attn_implementation 'flash_attention_2' (LightRFT's --flash_attn) needs the "
            f"flash-attn package, which is not installed: {FLASH_ATTENTION_EXTRA}; the default "
            "sdpa kernel needs nothing"
        )
    if not torch.cuda.is_available():
        raise ConfigError(
            "attn_implementation 'flash_attention_2' (LightRFT's --flash_attn) runs on CUDA "
            "only, and no CUDA device is visible; the default sdpa kernel runs anywhere"
        )


def train_backend_name(config: TrainFields) -> str:
    """The train backend a config trains with: ``train_backend``, else ``deepspeed`` when
    ``zero_stage`` is set, else ``fsdp2``."""
    if config.train_backend is not None:
        return config.train_backend
    return "fsdp2" if config.zero_stage is None else "deepspeed"


def _check_train_backend(config: TrainFields) -> None:
    name = config.train_backend
    if name is None:
        return
    if name == "fsdp2" and config.zero_stage is not None:
        raise ConfigError(
            f"train_backend 'fsdp2' (LightRFT's --fsdp) trains with FSDP2, but zero_stage "
            f"{config.zero_stage} trains with DeepSpeed ZeRO: choose one"
        )
    if name == "deepspeed" and config.zero_stage is None:
        raise ConfigError("train_backend 'deepspeed' needs zero_stage (1, 2 or 3)")
    if name in ("fsdp2", "deepspeed"):
        return
    lrft_settings = {
        "zero_stage": config.zero_stage is not None,
        "deepspeed_config": config.deepspeed_config is not None,
        "fsdp_cpu_offload": config.fsdp_cpu_offload,
        "fsdp_reshard_after_forward": not config.fsdp_reshard_after_forward,
        "fsdp_defer_gradient_sync": config.fsdp_defer_gradient_sync,
    }
    for setting, is_set in lrft_settings.items():
        if is_set:
            raise ConfigError(
                f"{setting} is a setting of lrft's own train backends, but train_backend is "
                f"{name!r}, which is built from its own settings: leave {setting} unset"
            )
