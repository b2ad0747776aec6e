"""Tiny models and data for tests: built from configs, no hub, deterministic by seed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedModel, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

M = TypeVar("M", bound=torch.nn.Module)

VOCAB_SIZE = 256


def tiny_qwen2_config(
    *,
    vocab_size: int = VOCAB_SIZE,
    tie_word_embeddings: bool = False,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
) -> Qwen2Config:
    """A 2-layer Qwen2 with hidden size 64: ~0.1 M parameters, fast on two CPU cores.

    The default 4 heads give head_dim 16; engines whose attention kernels need larger heads
    (vLLM's CPU attention needs head_dim >= 32) use 2 heads.
    """
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=256,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        use_cache=True,
    )


# transformers' default initialisation (std 0.02) makes a random model repeat one token, which
# makes greedy checks weak; much larger weights (0.5) blow activations up until the KV-cache and
# full-recompute paths differ by ~6e-5 in logprob in fp32. At 0.12 greedy continuations are
# varied and the two paths agree within ~3e-6.
INITIALIZER_RANGE = 0.12


def tiny_causal_lm(
    seed: int = 0,
    *,
    tie_word_embeddings: bool = False,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
) -> PreTrainedModel:
    """A freshly initialised tiny Qwen2 causal LM in fp32; the same ``seed`` gives the same weights.

    Every tensor depends on the seed: norm weights (which start at 1) and biases (at 0) are
    perturbed, so that two seeds differ in every tensor and a load that skips one is visible.
    """
    config = tiny_qwen2_config(
        tie_word_embeddings=tie_word_embeddings,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
    )
    config.initializer_range = INITIALIZER_RANGE
    return seeded_model(lambda: Qwen2ForCausalLM(config), seed)


def seeded_model(build: Callable[[], M], seed: int) -> M:
    """``build()`` under ``seed`` (the caller's RNG left as it was), in eval mode, with every
    constant tensor (norm weights at 1, biases at 0) perturbed: two seeds then differ in every
    tensor, so a load that skips one is visible."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        model = build()
        for parameter in model.parameters():
            if bool((parameter == parameter.flatten()[0]).all()):
                parameter.add_(torch.randn_like(parameter), alpha=0.05)
    torch.nn.Module.eval(model)  # PreTrainedModel re-declares eval without annotations
    return model


def byte_tokenizer(special_tokens: Sequence[str], *, eos: str, pad: str) -> PreTrainedTokenizerFast:
    """Byte-level with no merges (one token per byte), then ``special_tokens`` in order (the
    EOS and padding tokens among them): ids that a tiny model's config can name."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={s: i for i, s in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(special_tokens))
    # transformers 5 aliases PreTrainedTokenizerFast to TokenizersBackend, whose __init__ takes
    # unannotated (*args, **kwargs).
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # unannotated in transformers
        tokenizer_object=backend, eos_token=eos, pad_token=pad
    )


def save_tiny_causal_lm(
    directory: Path,
    seed: int = 0,
    *,
    tie_word_embeddings: bool = False,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
) -> Path:
    """Save ``tiny_causal_lm(seed, ...)`` as a Hugging Face folder (safetensors) and return it."""
    model = tiny_causal_lm(
        seed,
        tie_word_embeddings=tie_word_embeddings,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
    )
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    return directory


def random_token_batch(seed: int, batch: int, length: int, *, low: int = 3) -> torch.Tensor:
    """Token ids in ``[low, VOCAB_SIZE)`` (ids below ``low`` are pad/bos/eos), shape (batch, length)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(low, VOCAB_SIZE, (batch, length), generator=generator)
