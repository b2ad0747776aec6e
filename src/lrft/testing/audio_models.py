"""A tiny Qwen2-Audio and its processor for tests: built from a config, no hub, deterministic by seed.

The model folder holds what a real Qwen2-Audio checkpoint does that lrft reads: the weights, the
tokenizer (byte-level, with Qwen2-Audio's audio special tokens), the feature extractor's
settings (a ``WhisperFeatureExtractor`` like the real one's, with 16 mel bins and a window of
``WINDOW_SECONDS`` instead of 128 and 30 s), the processor's class and a chat template that
places ``<|audio_bos|><|AUDIO|><|audio_eos|>`` where a message's content holds an audio part.
A clip of ``s`` seconds gives about ``25 s`` audio tokens (0.1 s: 2 tokens, 1 s: 25).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast, Qwen2AudioConfig

from lrft.api.media import AudioClip
from lrft.testing.models import INITIALIZER_RANGE, byte_tokenizer, seeded_model

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
AUDIO_TOKENS = ("<|audio_bos|>", "<|audio_eos|>", "<|AUDIO|>")
BYTES = 256
EOS_ID = BYTES
PAD_ID = BYTES + 1
AUDIO_BOS_ID, AUDIO_EOS_ID, AUDIO_TOKEN_ID = range(BYTES + 2, BYTES + 5)
VOCAB_SIZE = BYTES + 5

SAMPLING_RATE = 16_000
"""The feature extractor's rate, Whisper's (clips at another rate are resampled when read)."""
WINDOW_SECONDS = 1
"""The feature extractor's window: every clip is padded to it, a longer one would be cut."""
HOP_LENGTH = 160
MEL_BINS = 16
FRAMES = WINDOW_SECONDS * SAMPLING_RATE // HOP_LENGTH
"""Mel frames of one window (100): the encoder's two convolutions halve them once."""

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'][0] }}:"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'audio' %}<|audio_bos|><|AUDIO|><|audio_eos|>"
    "{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %};{% endfor %}"
    "{% if add_generation_prompt %}a:{% endif %}"
)
"""Compact on purpose (every character is a token): ``u:<audio>what?;a:``."""


def tiny_audio_lm_config(
    *, num_attention_heads: int = 4, num_key_value_heads: int = 2
) -> Qwen2AudioConfig:
    """A Qwen2-Audio with a 2-layer text model (hidden size 64) and a 2-layer audio encoder
    (d_model 32, 16 mel bins, ``FRAMES // 2`` source positions): ~0.15 M parameters."""
    settings: dict[str, Any] = {
        "bos_token_id": None,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "tie_word_embeddings": False,
        "initializer_range": INITIALIZER_RANGE,
    }
    return Qwen2AudioConfig(
        text_config={
            "model_type": "qwen2",
            "vocab_size": VOCAB_SIZE,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": num_attention_heads,
            "num_key_value_heads": num_key_value_heads,
            "max_position_embeddings": 512,
            "bos_token_id": None,
            "eos_token_id": EOS_ID,
            "pad_token_id": PAD_ID,
            "initializer_range": INITIALIZER_RANGE,
        },
        audio_config={
            "model_type": "qwen2_audio_encoder",
            "num_mel_bins": MEL_BINS,
            "encoder_layers": 2,
            "encoder_attention_heads": 2,
            "encoder_ffn_dim": 64,
            "d_model": 32,
            "max_source_positions": FRAMES // 2,
            "initializer_range": INITIALIZER_RANGE,
        },
        audio_token_index=AUDIO_TOKEN_ID,
        **settings,
    )


def tiny_audio_lm(seed: int = 0, **heads: int) -> PreTrainedModel:
    """A freshly initialised tiny Qwen2-Audio in fp32, eval mode; the seed decides every tensor."""
    from transformers import Qwen2AudioForConditionalGeneration

    config = tiny_audio_lm_config(**heads)
    return seeded_model(lambda: Qwen2AudioForConditionalGeneration(config), seed)


def audio_lm_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level with no merges (one token per byte), then EOS, padding and the audio tokens."""
    tokenizer = byte_tokenizer([EOS_TOKEN, PAD_TOKEN, *AUDIO_TOKENS], eos=EOS_TOKEN, pad=PAD_TOKEN)
    tokenizer.chat_template = CHAT_TEMPLATE
    assert len(tokenizer) == VOCAB_SIZE, f"{len(tokenizer)} tokens, expected {VOCAB_SIZE}"
    audio_id = tokenizer.convert_tokens_to_ids("<|AUDIO|>")
    assert audio_id == AUDIO_TOKEN_ID, f"<|AUDIO|> is {audio_id}, expected {AUDIO_TOKEN_ID}"
    return tokenizer


def save_audio_processor_files(
    directory: Path, tokenizer: PreTrainedTokenizerFast, chat_template: str = CHAT_TEMPLATE
) -> None:
    """The processor as a Qwen2-Audio checkpoint has it (``Qwen2AudioProcessor.save_pretrained``:
    tokenizer, feature extractor settings, processor class, chat template)."""
    from transformers import Qwen2AudioProcessor, WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor(  # type: ignore[no-untyped-call]  # unannotated in transformers
        feature_size=MEL_BINS,
        sampling_rate=SAMPLING_RATE,
        hop_length=HOP_LENGTH,
        chunk_length=WINDOW_SECONDS,
        n_fft=400,
    )
    processor = Qwen2AudioProcessor(  # type: ignore[no-untyped-call]  # unannotated in transformers
        feature_extractor=extractor, tokenizer=tokenizer, chat_template=chat_template
    )
    directory.mkdir(parents=True, exist_ok=True)
    processor.save_pretrained(directory)


def save_tiny_audio_lm(directory: Path, seed: int = 0, **heads: int) -> Path:
    """Save ``tiny_audio_lm(seed)`` with its processor files as one Hugging Face folder."""
    model = tiny_audio_lm(seed, **heads)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    save_audio_processor_files(directory, audio_lm_tokenizer())
    return directory


def tone(seed: int, seconds: float, sampling_rate: int = SAMPLING_RATE) -> AudioClip:
    """A clip of a few random sine tones plus a little noise, the same for the same seed."""
    generator = torch.Generator().manual_seed(seed)
    samples = max(1, round(seconds * sampling_rate))
    times = torch.arange(samples, dtype=torch.float64) / sampling_rate
    frequencies = 200 + 3000 * torch.rand(3, generator=generator, dtype=torch.float64)
    wave = torch.sin(2 * torch.pi * frequencies[:, None] * times[None, :]).sum(0) / 4
    wave += 0.05 * torch.randn(samples, generator=generator, dtype=torch.float64)
    return AudioClip(waveform=wave.clamp(-1, 1).float(), sampling_rate=sampling_rate)
