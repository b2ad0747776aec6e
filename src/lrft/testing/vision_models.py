"""A tiny Qwen2-VL and its processor for tests: built from a config, no hub, deterministic by seed.

The model folder holds everything a real Qwen2-VL checkpoint does that lrft reads: the weights,
the tokenizer (byte-level, with Qwen2-VL's vision special tokens), the image processor's
settings, the processor's class and a chat template that places ``<|vision_start|>
<|image_pad|><|vision_end|>`` where a message's content holds an image. Images of 28 x 28
pixels give one image token (a 2 x 2 patch grid merged 2 x 2); larger ones up to
``MAX_PIXELS`` more.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast, Qwen2VLConfig

from lrft.testing.models import INITIALIZER_RANGE, byte_tokenizer, seeded_model

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
BYTES = 256
EOS_ID = BYTES
PAD_ID = BYTES + 1
VISION_START_ID, VISION_END_ID, IMAGE_TOKEN_ID, VIDEO_TOKEN_ID = range(BYTES + 2, BYTES + 6)
VOCAB_SIZE = BYTES + 6

PATCH_SIZE = 14
MERGE_SIZE = 2
MIN_PIXELS = (PATCH_SIZE * MERGE_SIZE) ** 2
"""The smallest image the processor makes: 28 x 28 pixels, one image token."""
MAX_PIXELS = 4 * 56 * 56
"""Larger images are scaled down to at most this many pixels (16 image tokens)."""

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'][0] }}:"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %};{% endfor %}"
    "{% if add_generation_prompt %}a:{% endif %}"
)
"""Compact on purpose (every character is a token): ``u:<image>what?;a:``."""


def tiny_vlm_config(*, num_attention_heads: int = 4, num_key_value_heads: int = 2) -> Qwen2VLConfig:
    """A 2-layer Qwen2-VL, text hidden size 64, vision tower of depth 2: ~0.2 M parameters.

    m-RoPE sections (2, 3, 3) cover the 8 rotary frequencies of head dim 16; with 2 heads
    (head dim 32, for engines whose kernels need it) they are doubled.
    """
    head_dim = 64 // num_attention_heads
    section = [2, 3, 3] if head_dim == 16 else [4, 6, 6]
    # Qwen2VLConfig declares its own arguments only; the others reach PreTrainedConfig.
    settings: dict[str, Any] = {
        "bos_token_id": None,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "tie_word_embeddings": False,
        "initializer_range": INITIALIZER_RANGE,
    }
    return Qwen2VLConfig(
        text_config={
            "vocab_size": VOCAB_SIZE,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": num_attention_heads,
            "num_key_value_heads": num_key_value_heads,
            "max_position_embeddings": 512,
            "rope_scaling": {"type": "mrope", "mrope_section": section},
            "bos_token_id": None,
            "eos_token_id": EOS_ID,
            "pad_token_id": PAD_ID,
            "initializer_range": INITIALIZER_RANGE,
        },
        vision_config={
            "depth": 2,
            "embed_dim": 32,
            "hidden_size": 64,
            "num_heads": 2,
            "patch_size": PATCH_SIZE,
            "spatial_merge_size": MERGE_SIZE,
            "temporal_patch_size": 2,
            "initializer_range": INITIALIZER_RANGE,
        },
        image_token_id=IMAGE_TOKEN_ID,
        video_token_id=VIDEO_TOKEN_ID,
        vision_start_token_id=VISION_START_ID,
        vision_end_token_id=VISION_END_ID,
        **settings,
    )


def tiny_vlm(seed: int = 0, **heads: int) -> PreTrainedModel:
    """A freshly initialised tiny Qwen2-VL in fp32, eval mode; the seed decides every tensor."""
    from transformers import Qwen2VLForConditionalGeneration

    config = tiny_vlm_config(**heads)
    return seeded_model(lambda: Qwen2VLForConditionalGeneration(config), seed)


def vlm_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level with no merges (one token per byte), then EOS, padding and the vision tokens."""
    tokenizer = byte_tokenizer([EOS_TOKEN, PAD_TOKEN, *VISION_TOKENS], eos=EOS_TOKEN, pad=PAD_TOKEN)
    tokenizer.chat_template = CHAT_TEMPLATE
    assert len(tokenizer) == VOCAB_SIZE, f"{len(tokenizer)} tokens, expected {VOCAB_SIZE}"
    image_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert image_id == IMAGE_TOKEN_ID, f"<|image_pad|> is {image_id}, expected {IMAGE_TOKEN_ID}"
    return tokenizer


def save_processor_files(
    directory: Path, tokenizer: PreTrainedTokenizerFast, chat_template: str = CHAT_TEMPLATE
) -> None:
    """The processor's files as a Qwen2-VL checkpoint has them: the tokenizer, the image
    processor's settings, the processor's class and its chat template. Written by hand:
    transformers cannot build a ``Qwen2VLProcessor`` without torchvision (its video processor
    needs it), so its ``save_pretrained`` is out of reach here."""
    from transformers import Qwen2VLImageProcessor

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(directory)
    image_processor = Qwen2VLImageProcessor(
        min_pixels=MIN_PIXELS,
        max_pixels=MAX_PIXELS,
        patch_size=PATCH_SIZE,
        merge_size=MERGE_SIZE,
        temporal_patch_size=2,
    )
    image_processor.save_pretrained(directory)
    (directory / "processor_config.json").write_text(
        json.dumps({"processor_class": "Qwen2VLProcessor"}, indent=2) + "\n"
    )
    (directory / "chat_template.jinja").write_text(chat_template)


def save_tiny_vlm(directory: Path, seed: int = 0, **heads: int) -> Path:
    """Save ``tiny_vlm(seed)`` with its processor files as one Hugging Face folder."""
    model = tiny_vlm(seed, **heads)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    save_processor_files(directory, vlm_tokenizer())
    return directory


def noise_image(seed: int, width: int, height: int) -> PILImage:
    """An RGB image of uniform noise, the same for the same seed and size."""
    from PIL import Image

    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (height, width, 3), dtype=torch.uint8, generator=generator)
    return Image.fromarray(pixels.numpy(), mode="RGB")
