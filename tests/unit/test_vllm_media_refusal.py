"""The vllm engine takes text prompts only: a model folder with an audio tower is refused with
``CapabilityNotSupported`` naming ``audio``, before vLLM is imported or started (so this runs
without vllm installed; the vision-language case is in tests/unit/trainer/test_media_config.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lrft.api import CapabilityNotSupported
from lrft.backends.rollout.vllm import VLLMRolloutEngine
from lrft.testing.audio_models import (
    audio_lm_tokenizer,
    save_audio_processor_files,
    tiny_audio_lm_config,
)


def test_an_audio_language_model_is_refused_naming_audio(tmp_path: Path) -> None:
    tiny_audio_lm_config().save_pretrained(tmp_path)
    save_audio_processor_files(tmp_path, audio_lm_tokenizer())
    with pytest.raises(
        CapabilityNotSupported, match="'qwen2_audio' model with an audio tower"
    ) as refused:
        VLLMRolloutEngine(tmp_path)
    assert (refused.value.backend, refused.value.capability) == ("vllm", "audio")
