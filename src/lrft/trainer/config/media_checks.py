"""The rules of :class:`lrft.trainer.config.TrainConfig` on its media settings (vision-language
models): what images and the vision demo need, and what does not take images yet. Run by
``TrainConfig`` at construction, after the rules of :mod:`lrft.trainer.config.checks`."""

from __future__ import annotations

from lrft.api.errors import ConfigError
from lrft.trainer.config.fields import TrainFields


def check_media_settings(config: TrainFields) -> None:
    """The media settings need what they act on: images need the chat template, the image limit
    needs images."""
    if config.images_key is not None and not config.apply_chat_template:
        raise ConfigError(
            f"images_key {config.images_key!r} needs apply_chat_template: the model's chat "
            "template writes the image placeholders its processor expands"
        )
    if config.limit_mm_image_per_prompt is not None and config.images_key is None:
        raise ConfigError(
            f"limit_mm_image_per_prompt {config.limit_mm_image_per_prompt} needs images_key "
            "(without it no prompt has images)"
        )
    if config.images_key is not None and config.engine_type != "hf":
        raise ConfigError(
            f"images_key {config.images_key!r} with engine_type {config.engine_type!r}: only the "
            "hf engine generates from images (docs/multimodal.md says why vllm does not)"
        )
    if config.freeze_vision_tower and config.lora_rank > 0:
        raise ConfigError(
            f"freeze_vision_tower with lora_rank {config.lora_rank}: LoRA keeps every base "
            "weight as loaded already, and adapters on the tower's layers would still train it; "
            "leave the tower without adapters by naming the language model's projections in "
            "target_modules (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)"
        )
    if config.demo != "addition" and config.preset is not None:
        raise ConfigError(
            f"demo {config.demo!r} runs only when no preset (and no pretrain) is given: it brings "
            "its own model and data"
        )
