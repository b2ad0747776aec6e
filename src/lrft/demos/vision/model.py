"""The vision demo's model: a tiny Qwen2-VL shipped as a Hugging Face folder in
``lrft/demos/vision/assets``, with its tokenizer and processor files.

``scripts/make_vision_demo_model.py`` builds the folder (architecture from :func:`model_config`,
a short supervised warm-up on the training scenes). The tokenizer is the addition demo's (one
token per byte, then end-of-sequence and padding) plus Qwen2-VL's vision tokens; the processor
is Qwen2-VL's own, its image processor set to keep the demo's 84 x 84 images at that size (6 x 6
patches of 14 pixels, merged 2 x 2 into 9 image tokens, one per cell of the scene).
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2VLConfig

from lrft.demos.tokenizer import EOS_TOKEN, PAD_TOKEN, _byte_symbols
from lrft.demos.vision.task import SIZE

ASSETS_DIR = Path(__file__).resolve().parent / "assets"
"""The shipped model, tokenizer and processor (``from_pretrained`` loads them offline)."""

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
EOS_ID, PAD_ID = 256, 257
VISION_START_ID, VISION_END_ID, IMAGE_TOKEN_ID, VIDEO_TOKEN_ID = range(258, 262)
VOCAB_SIZE = 262
PATCH_SIZE = 14
MERGE_SIZE = 2
MAX_NEW_TOKENS = 3
"""An answer (one digit), the end-of-sequence token and a spare one."""

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] != 'user' %}"
    "{{ raise_exception('the vision demo model knows only user messages, got ' "
    "+ message['role']) }}"
    "{% endif %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}={% endif %}"
)
"""A chat renders as its user content, images as Qwen2-VL's placeholders, then ``=``:
``<|vision_start|><|image_pad|><|vision_end|>how many shapes?=``."""


def model_config() -> Qwen2VLConfig:
    """The demo architecture: a 2-layer text model of hidden size 128 and a 2-block vision tower
    of width 64; ~0.5 M parameters."""
    settings: dict[str, object] = {
        "bos_token_id": None,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "tie_word_embeddings": True,
    }
    return Qwen2VLConfig(
        text_config={
            "vocab_size": VOCAB_SIZE,
            "hidden_size": 128,
            "intermediate_size": 384,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 128,
            "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]},
            "bos_token_id": None,
            "eos_token_id": EOS_ID,
            "pad_token_id": PAD_ID,
            "tie_word_embeddings": True,
        },
        vision_config={
            "depth": 2,
            "embed_dim": 64,
            "hidden_size": 128,
            "mlp_ratio": 2,
            "num_heads": 4,
            "patch_size": PATCH_SIZE,
            "spatial_merge_size": MERGE_SIZE,
            "temporal_patch_size": 2,
        },
        image_token_id=IMAGE_TOKEN_ID,
        video_token_id=VIDEO_TOKEN_ID,
        vision_start_token_id=VISION_START_ID,
        vision_end_token_id=VISION_END_ID,
        **settings,  # type: ignore[arg-type]  # PreTrainedConfig's own arguments
    )


def build_tokenizer() -> PreTrainedTokenizerFast:
    """One token per byte, ``<|endoftext|>`` (256), ``<|pad|>`` (257), then the vision tokens."""
    vocab = {symbol: byte for byte, symbol in enumerate(_byte_symbols())}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([EOS_TOKEN, PAD_TOKEN, *VISION_TOKENS])
    # transformers 5 aliases PreTrainedTokenizerFast to TokenizersBackend, whose __init__ takes
    # unannotated (*args, **kwargs).
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # unannotated in transformers
        tokenizer_object=backend, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    assert len(tokenizer) == VOCAB_SIZE
    assert tokenizer.convert_tokens_to_ids("<|image_pad|>") == IMAGE_TOKEN_ID
    return tokenizer


def save_processor_files(directory: Path) -> None:
    """The tokenizer and Qwen2-VL's processor files (written by hand: transformers cannot build
    a ``Qwen2VLProcessor`` without torchvision, see :mod:`lrft.data.processor`)."""
    from transformers import Qwen2VLImageProcessor

    directory.mkdir(parents=True, exist_ok=True)
    build_tokenizer().save_pretrained(directory)
    pixels = SIZE * SIZE
    image_processor = Qwen2VLImageProcessor(
        min_pixels=pixels,
        max_pixels=pixels,
        patch_size=PATCH_SIZE,
        merge_size=MERGE_SIZE,
        temporal_patch_size=2,
    )
    image_processor.save_pretrained(directory)
    (directory / "processor_config.json").write_text(
        json.dumps({"processor_class": "Qwen2VLProcessor"}, indent=2) + "\n"
    )
    (directory / "chat_template.jinja").write_text(CHAT_TEMPLATE)
