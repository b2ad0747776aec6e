"""The rules of :class:`lrft.config.TrainConfig` on its media settings (vision- and
audio-language models): what images, audio and the vision demo need, and what does not take
media yet. Run by ``TrainConfig`` at construction, after the rules of
:mod:`lrft.config.checks`."""

from __future__ import annotations

from lrft.algo import advantage_estimators
from lrft.api.errors import ConfigError
from lrft.config.checks import value_based_estimators
from lrft.config.fields import TrainFields


def check_media_settings(config: TrainFields) -> None:
    """The media settings need what they act on: images and audio need the chat template, a
    per-prompt limit needs its modality's column; only the hf engine takes media, and the critic
    takes no audio."""
    media = (
        ("images_key", config.images_key, "images", "limit_mm_image_per_prompt",
         config.limit_mm_image_per_prompt),
        ("audios_key", config.audios_key, "audio", "limit_mm_audio_per_prompt",
         config.limit_mm_audio_per_prompt),
    )  # fmt: skip
    for option, key, what, limit_name, limit in media:
        if key is not None and not config.apply_chat_template:
            raise ConfigError(
                f"{option} {key!r} needs apply_chat_template: the model's chat template writes "
                f"the {'image' if what == 'images' else what} placeholders its processor expands"
            )
        if limit is not None and key is None:
            raise ConfigError(
                f"{limit_name} {limit} needs {option} (without it no prompt has {what})"
            )
        if key is not None and config.engine_type != "hf":
            raise ConfigError(
                f"{option} {key!r} with engine_type {config.engine_type!r}: only the hf engine "
                f"generates from {what} (docs/multimodal.md says why vllm does not)"
            )
    for option, frozen, tower in (
        ("freeze_vision_tower", config.freeze_vision_tower, "tower"),
        ("freeze_audio_tower", config.freeze_audio_tower, "audio encoder"),
    ):
        if frozen and config.lora_rank > 0:
            raise ConfigError(
                f"{option} with lora_rank {config.lora_rank}: LoRA keeps every base weight as "
                f"loaded already, and adapters on the {tower}'s layers would still train it; "
                f"leave the {tower} without adapters by naming the language model's projections "
                "in target_modules (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)"
            )
    if (
        config.audios_key is not None
        and advantage_estimators.get(config.advantage_estimator).needs_values
    ):
        valueless = [n for n in advantage_estimators.names() if n not in value_based_estimators()]
        raise ConfigError(
            f"audios_key {config.audios_key!r} with advantage_estimator "
            f"{config.advantage_estimator!r}: the critic does not see audio (lrft has a critic "
            "form for Qwen2-VL's images, none for an audio tower); choose an estimator without "
            f"values ({', '.join(valueless)})"
        )
    if config.demo != "addition" and config.preset is not None:
        raise ConfigError(
            f"demo {config.demo!r} runs only when no preset (and no pretrain) is given: it brings "
            "its own model and data"
        )
