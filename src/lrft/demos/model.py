"""The demo model: a tiny Qwen2 shipped as a Hugging Face folder in ``lrft/demos/assets``.

``scripts/make_demo_model.py`` builds the folder (architecture from :func:`model_config`, a short
supervised warm-up on the training problems). The helpers here decode without transformers'
``generate``: prompts are batched by length, so no padding is needed and the sampling is exactly
what a test or a script asks for.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
)

from lrft.demos.task import Problem, is_correct
from lrft.demos.tokenizer import EOS_ID, MAX_LENGTH, PAD_ID, VOCAB_SIZE

ASSETS_DIR = Path(__file__).resolve().parent / "assets"
"""The shipped model and tokenizer (``from_pretrained`` loads it offline)."""

MAX_NEW_TOKENS = 5
"""Enough for any answer of the default task (at most 3 digits), the end-of-sequence token and a
spare one."""


def model_config() -> Qwen2Config:
    """The demo architecture: 3 layers, hidden size 128, tied embeddings; ~0.6 M parameters."""
    return Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_LENGTH,
        tie_word_embeddings=True,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        bos_token_id=None,
        use_cache=True,
    )


def load_tokenizer(directory: str | os.PathLike[str] = ASSETS_DIR) -> PreTrainedTokenizerBase:
    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(directory)
    return tokenizer


def load_model(directory: str | os.PathLike[str] = ASSETS_DIR) -> PreTrainedModel:
    """The demo model in fp32, in eval mode."""
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    torch.nn.Module.eval(model)  # PreTrainedModel re-declares eval without annotations
    return model


def _logits(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    logits: torch.Tensor = model(input_ids=input_ids).logits
    return logits


@torch.no_grad()
def complete(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    temperature: float = 0.0,
    max_new_tokens: int = MAX_NEW_TOKENS,
    generator: torch.Generator | None = None,
) -> list[list[int]]:
    """One completion per prompt: token ids after the prompt, up to and including EOS.

    ``temperature`` 0 is greedy; otherwise tokens are sampled from the softmax at that
    temperature with ``generator``. Prompts of equal length go through the model together, so
    there is no padding, and each step recomputes the whole (short) sequence.
    """
    by_length: dict[int, list[int]] = defaultdict(list)
    for index, prompt in enumerate(prompts):
        by_length[len(prompt)].append(index)
    completions: list[list[int]] = [[] for _ in prompts]
    for indices in by_length.values():
        sequences = torch.tensor([list(prompts[i]) for i in indices], dtype=torch.long)
        finished = torch.zeros(len(indices), dtype=torch.bool)
        width = sequences.shape[1]
        for _ in range(max_new_tokens):
            last = _logits(model, sequences)[:, -1, :].float()
            if temperature == 0.0:
                token = last.argmax(dim=-1)
            else:
                probabilities = torch.softmax(last / temperature, dim=-1)
                token = torch.multinomial(probabilities, 1, generator=generator).squeeze(1)
            token = torch.where(finished, torch.full_like(token, PAD_ID), token)
            sequences = torch.cat([sequences, token[:, None]], dim=1)
            finished |= token == EOS_ID
            if bool(finished.all()):
                break
        for row, index in enumerate(indices):
            generated = sequences[row, width:].tolist()
            end = generated.index(EOS_ID) + 1 if EOS_ID in generated else len(generated)
            completions[index] = generated[:end]
    return completions


def answer_accuracy(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    *,
    temperature: float = 0.0,
    samples: int = 1,
    seed: int = 0,
) -> float:
    """The fraction of ``samples`` completions per problem that answer it exactly."""
    prompts = [tokenizer.encode(p.prompt) for p in problems for _ in range(samples)]
    answers = [p.answer for p in problems for _ in range(samples)]
    generator = torch.Generator().manual_seed(seed)
    completions = complete(model, prompts, temperature=temperature, generator=generator)
    responses = tokenizer.batch_decode(completions, skip_special_tokens=True)
    return sum(is_correct(r, a) for r, a in zip(responses, answers, strict=True)) / len(answers)
