"""The vllm engine takes text prompts only: a model folder with a vision or audio tower is refused
with ``CapabilityNotSupported`` naming the modality, before vLLM is imported or started (so this
runs without vllm installed)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from transformers import PretrainedConfig

from lrft.api import CapabilityNotSupported
from lrft.backends.rollout.vllm import VLLMRolloutEngine
from lrft.testing.audio_models import save_audio_processor_files, tiny_audio_lm_config
from lrft.testing.vision_models import tiny_vlm_config


@pytest.mark.parametrize(
    ("config", "modality", "tower"),
    [(tiny_audio_lm_config, "audio", "audio tower"), (tiny_vlm_config, "images", "vision tower")],
)
def test_media_models_are_refused_naming_the_modality(
    tmp_path: Path, config: Callable[[], PretrainedConfig], modality: str, tower: str
) -> None:
    config().save_pretrained(tmp_path)
    if modality == "audio":
        from lrft.testing.audio_models import audio_lm_tokenizer

        save_audio_processor_files(tmp_path, audio_lm_tokenizer())
    with pytest.raises(CapabilityNotSupported, match=f"with a {tower.split()[0]} tower") as error:
        VLLMRolloutEngine(tmp_path)
    assert error.value.capability == modality
    assert error.value.backend == "vllm"
