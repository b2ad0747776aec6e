"""What a workload needs on disk: a random-weight model folder with a tokenizer, prompt files.

The GRPO part runs ``lrft train``'s own builder, which reads a Hugging Face folder and a prompt
file, so the benchmark writes both. The tokenizer is the demo's byte-level one with an added
token ``<tN>`` for every further id of the model's vocabulary: a prompt of ``k`` random ids in
that range is the text of ``k`` added tokens and encodes back to exactly those ``k`` ids, and
any id the random model generates decodes to text (the length reward reads it). A model with a
vision tower (``model.vision``) gives Qwen2-VL's four vision tokens the last ids of the
vocabulary and its folder the processor's files; its prompts each follow one noise image.

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
from typing import TYPE_CHECKING, Any

import attrs
import torch
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2VLConfig,
)

from lrft.api.errors import ConfigError
from lrft.bench.workloads import ImageSpec, ModelSpec, PromptSpec
from lrft.demos.tokenizer import EOS_ID, PAD_ID, build_tokenizer

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

FIRST_WORD_ID = PAD_ID + 1
"""The first id of the added ``<tN>`` tokens (the byte tokens, EOS and padding come first)."""
_COMPLETE = "lrft_bench_complete"
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
"""Qwen2-VL's vision tokens, at the last four ids of a vision model's vocabulary."""
IMAGES_KEY = "images"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{% endfor %}"
)
"""A vision model's chat template: the user content, images as Qwen2-VL's placeholders (no
role markers, so a prompt's ids are its image tokens and its word tokens, nothing else)."""


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


def words_end(spec: ModelSpec) -> int:
    """One past the last word-token id: the vocabulary's end, less a vision model's tokens."""
    return spec.vocab_size - (len(VISION_TOKENS) if spec.vision is not None else 0)


def qwen2_vl_config(spec: ModelSpec) -> Qwen2VLConfig:
    """The Qwen2-VL of ``spec``: its Qwen2 language model and its vision tower."""
    vision = spec.vision
    assert vision is not None
    text = qwen2_config(spec).to_dict()
    text["rope_scaling"] = {"type": "mrope", "mrope_section": list(vision.mrope_section)}
    start, end, image, video = range(words_end(spec), spec.vocab_size)
    # Qwen2VLConfig declares its own arguments only; these reach PreTrainedConfig.
    settings: dict[str, Any] = {
        "tie_word_embeddings": spec.tie_word_embeddings,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "bos_token_id": None,
    }
    return Qwen2VLConfig(
        text_config=text,
        vision_config={
            "depth": vision.depth,
            "embed_dim": vision.embed_dim,
            "hidden_size": spec.hidden_size,
            "num_heads": vision.num_heads,
            "mlp_ratio": vision.mlp_ratio,
            "patch_size": vision.patch_size,
            "spatial_merge_size": vision.spatial_merge_size,
            "temporal_patch_size": vision.temporal_patch_size,
        },
        image_token_id=image,
        video_token_id=video,
        vision_start_token_id=start,
        vision_end_token_id=end,
        **settings,
    )


def random_model(spec: ModelSpec, device: torch.device | None = None) -> PreTrainedModel:
    """transformers' initialisation of ``spec`` under ``spec.seed``, in fp32, on ``device``
    (built there directly: a 1.5 B model initialises in a fraction of the CPU's time)."""
    target = device if device is not None else torch.device("cpu")
    devices = [target] if target.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), target:
        torch.manual_seed(spec.seed)
        if spec.vision is None:
            model: PreTrainedModel = Qwen2ForCausalLM(qwen2_config(spec))
        else:
            from transformers import Qwen2VLForConditionalGeneration

            model = Qwen2VLForConditionalGeneration(qwen2_vl_config(spec))
    torch.nn.Module.eval(model)  # PreTrainedModel re-declares eval without annotations
    return model


def bench_tokenizer(vocab_size: int, *, vision: bool = False) -> PreTrainedTokenizerBase:
    tokenizer = build_tokenizer()
    end = vocab_size - (len(VISION_TOKENS) if vision else 0)
    tokenizer.add_tokens([word_token(i) for i in range(FIRST_WORD_ID, end)])
    if vision:
        tokenizer.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
        tokenizer.chat_template = CHAT_TEMPLATE
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
    tokenizer = bench_tokenizer(spec.vocab_size, vision=spec.vision is not None)
    tokenizer.save_pretrained(temporary)
    if spec.vision is not None:
        _save_processor_files(spec, temporary)
    return _publish(temporary, target)


def _save_processor_files(spec: ModelSpec, directory: Path) -> None:
    """Qwen2-VL's processor files, written by hand (transformers builds a ``Qwen2VLProcessor``
    only with torchvision, see :mod:`lrft.data.processor`)."""
    from transformers import Qwen2VLImageProcessor

    vision = spec.vision
    assert vision is not None
    Qwen2VLImageProcessor(
        patch_size=vision.patch_size,
        merge_size=vision.spatial_merge_size,
        temporal_patch_size=vision.temporal_patch_size,
    ).save_pretrained(directory)
    (directory / "processor_config.json").write_text(
        json.dumps({"processor_class": "Qwen2VLProcessor"}, indent=2) + "\n"
    )
    (directory / "chat_template.jinja").write_text(CHAT_TEMPLATE)


def image_tokens(spec: ModelSpec, image: ImageSpec) -> int:
    """The prompt tokens one image makes: its merged patches plus the start and end tokens
    (the processor resizes it to a multiple of the merged patch; the spec's sizes are ones)."""
    vision = spec.vision
    assert vision is not None
    merged = vision.patch_size * vision.spatial_merge_size
    return (image.width // merged) * (image.height // merged) + 2


def prompt_tokens(spec: PromptSpec, model: ModelSpec) -> int:
    """Every prompt's length in tokens: its word tokens and its image's."""
    return spec.tokens + (0 if spec.images is None else image_tokens(model, spec.images))


def prompt_ids(spec: PromptSpec, vocab_size: int) -> list[list[int]]:
    """``spec.count`` prompts of ``spec.tokens`` ids drawn uniformly from the word tokens below
    ``vocab_size`` (:func:`words_end` for a vision model)."""
    rng = random.Random(spec.seed)
    return [
        [rng.randrange(FIRST_WORD_ID, vocab_size) for _ in range(spec.tokens)]
        for _ in range(spec.count)
    ]


def prompt_file(spec: PromptSpec, vocab_size: int, work_dir: Path) -> Path:
    """A JSONL file of the prompts' texts under the key ``input``; with ``spec.images``, each
    text starts with ``<image>`` and its row names a PNG of noise (under ``images``, relative)."""
    target = work_dir / f"prompts-{_fingerprint(attrs.asdict(spec), vocab_size)}"
    if (target / _COMPLETE).is_file():
        return target / "prompts.jsonl"
    temporary = work_dir / f".{target.name}.{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir(parents=True)
    with (temporary / "prompts.jsonl").open("w", encoding="utf-8") as out:
        for index, ids in enumerate(prompt_ids(spec, vocab_size)):
            text = "".join(word_token(i) for i in ids)
            row: dict[str, object] = {"input": text}
            if spec.images is not None:
                name = f"image_{index:05d}.png"
                _noise_image(spec.images, spec.seed * 1_000_003 + index).save(temporary / name)
                row = {"input": f"<image>{text}", IMAGES_KEY: name}
            out.write(json.dumps(row) + "\n")
    return _publish(temporary, target) / "prompts.jsonl"


def _noise_image(spec: ImageSpec, seed: int) -> PILImage:
    from PIL import Image

    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randint(
        0, 256, (spec.height, spec.width, 3), dtype=torch.uint8, generator=generator
    )
    return Image.fromarray(pixels.numpy(), mode="RGB")
