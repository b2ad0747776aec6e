"""Tiny reward models and judges over the demo tokenizer, built from configs (no hub)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Qwen2ForCausalLM, Qwen2ForSequenceClassification

from lrft.demos.tokenizer import EOS_ID, PAD_ID, VOCAB_SIZE, build_tokenizer
from lrft.testing.models import INITIALIZER_RANGE, tiny_qwen2_config


def tiny_classifier(seed: int = 0) -> Qwen2ForSequenceClassification:
    """A random one-label Qwen2 classifier whose pad id is the demo tokenizer's."""
    config = tiny_qwen2_config(vocab_size=VOCAB_SIZE)
    config.num_labels = 1
    config.pad_token_id = PAD_ID
    config.initializer_range = INITIALIZER_RANGE
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForSequenceClassification(config)  # type: ignore[no-untyped-call]  # unannotated in transformers
    return model


def tiny_judge(seed: int = 0) -> Qwen2ForCausalLM:
    config = tiny_qwen2_config(vocab_size=VOCAB_SIZE)
    config.pad_token_id = PAD_ID
    config.eos_token_id = EOS_ID
    config.bos_token_id = None
    config.initializer_range = INITIALIZER_RANGE
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen2ForCausalLM(config)


def save_with_tokenizer(model: torch.nn.Module, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)  # type: ignore[operator]  # a transformers model
    build_tokenizer().save_pretrained(directory)
    return directory


def tiny_token_classifier(seed: int = 0, labels: int = 1) -> torch.nn.Module:
    """A random Qwen2 token classifier (a process reward model) over the demo tokenizer."""
    from transformers import Qwen2ForTokenClassification

    config = tiny_qwen2_config(vocab_size=VOCAB_SIZE)
    config.num_labels = labels
    config.pad_token_id = PAD_ID
    config.initializer_range = INITIALIZER_RANGE
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model: torch.nn.Module = Qwen2ForTokenClassification(config)  # type: ignore[no-untyped-call]  # unannotated in transformers
    return model
