"""What a workload needs on disk: a random-weight model folder with a tokenizer, prompt files.

The GRPO part runs ``lrft train``'s own builder, which reads a Hugging Face folder and a prompt
file, so the benchmark writes both. The tokenizer is the demo's byte-level one with an added
token ``<tN>`` for every further id of the model's vocabulary: a prompt of ``k`` random ids in
that range is the text of ``k`` added tokens and encodes back to exactly those ``k`` ids, and
any id the random model generates decodes to text (the length reward reads it).

Folders are cached under the work directory by a fingerprint of their spec; every rank may
build its own copy and rename it into place (same bytes), so no rank waits on another.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from pathlib import Path

import attrs
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

from lrft.api.errors import ConfigError
from lrft.bench.workloads import ModelSpec, PromptSpec
from lrft.trainer.demo.tokenizer import EOS_ID, PAD_ID, build_tokenizer

FIRST_WORD_ID = PAD_ID + 1
"""The first id of the added ``<tN>`` tokens (the byte tokens, EOS and padding come first)."""
_COMPLETE = "lrft_bench_complete"


def word_token(token_id: int) -> str:
    return f"<t{token_id}>"


def qwen2_config(spec: ModelSpec) -> Qwen2Config:
    if spec.vocab_size <= FIRST_WORD_ID:
        raise ConfigError(
            f"model.vocab_size {spec.vocab_size} must exceed {FIRST_WORD_ID} (the byte tokens, "
            "EOS and padding of the benchmark tokenizer come first)"
        )
    return Qwen2Config(
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        intermediate_size=spec.intermediate_size,
        vocab_size=spec.vocab_size,
        tie_word_embeddings=spec.tie_word_embeddings,
        max_position_embeddings=spec.max_position_embeddings,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        bos_token_id=None,
    )


def random_model(spec: ModelSpec, device: torch.device | None = None) -> PreTrainedModel:
    """transformers' initialisation of ``spec`` under ``spec.seed``, in fp32, on ``device``
    (built there directly: a 1.5 B model initialises in a fraction of the CPU's time)."""
    config = qwen2_config(spec)
    target = device if device is not None else torch.device("cpu")
    devices = [target] if target.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), target:
        torch.manual_seed(spec.seed)
        model = Qwen2ForCausalLM(config)
    torch.nn.Module.eval(model)  # PreTrainedModel re-declares eval without annotations
    return model


def bench_tokenizer(vocab_size: int) -> PreTrainedTokenizerBase:
    tokenizer = build_tokenizer()
    tokenizer.add_tokens([word_token(i) for i in range(FIRST_WORD_ID, vocab_size)])
    if len(tokenizer) != vocab_size:
        raise ConfigError(
            f"the benchmark tokenizer has {len(tokenizer)} tokens, expected {vocab_size}"
        )
    return tokenizer


def _fingerprint(*parts: object) -> str:
    return hashlib.blake2b(json.dumps(parts, sort_keys=True).encode(), digest_size=8).hexdigest()


def _publish(temporary: Path, target: Path) -> Path:
    (temporary / _COMPLETE).write_text("")
    try:
        os.rename(temporary, target)
    except OSError:
        # Another rank published the same bytes first.
        shutil.rmtree(temporary, ignore_errors=True)
    return target


def model_folder(spec: ModelSpec, work_dir: Path) -> Path:
    """A Hugging Face folder (config, weights in ``spec.saved_dtype``, tokenizer) for ``spec``."""
    target = work_dir / f"model-{_fingerprint(attrs.asdict(spec))}"
    if (target / _COMPLETE).is_file():
        return target
    temporary = work_dir / f".{target.name}.{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir(parents=True)
    model = random_model(spec)
    model.to(getattr(torch, spec.saved_dtype))
    model.save_pretrained(temporary)
    bench_tokenizer(spec.vocab_size).save_pretrained(temporary)
    return _publish(temporary, target)


def prompt_ids(spec: PromptSpec, vocab_size: int) -> list[list[int]]:
    """``spec.count`` prompts of ``spec.tokens`` ids drawn uniformly from the word tokens."""
    rng = random.Random(spec.seed)
    return [
        [rng.randrange(FIRST_WORD_ID, vocab_size) for _ in range(spec.tokens)]
        for _ in range(spec.count)
    ]


def prompt_file(spec: PromptSpec, vocab_size: int, work_dir: Path) -> Path:
    """A JSONL file of the prompts' texts under the key ``input``."""
    target = work_dir / f"prompts-{_fingerprint(attrs.asdict(spec), vocab_size)}"
    if (target / _COMPLETE).is_file():
        return target / "prompts.jsonl"
    temporary = work_dir / f".{target.name}.{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir(parents=True)
    with (temporary / "prompts.jsonl").open("w", encoding="utf-8") as out:
        for ids in prompt_ids(spec, vocab_size):
            out.write(json.dumps({"input": "".join(word_token(i) for i in ids)}) + "\n")
    return _publish(temporary, target) / "prompts.jsonl"
