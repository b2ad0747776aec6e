"""The demo tokenizer: one token per UTF-8 byte, plus an end-of-sequence and a padding token.

It is a byte-level BPE with no merges, built with ``tokenizers`` and wrapped in
``PreTrainedTokenizerFast``. Byte-level matters: next to a ``model_type: qwen2`` config,
transformers 5 loads any saved tokenizer as ``Qwen2Tokenizer``, which keeps the vocabulary and
merges but replaces the pre-tokenizer and decoder with Qwen's byte-level ones. A tokenizer that
is byte-level with no merges encodes and decodes the same way under both classes (a WordLevel or
plain-character vocabulary does not: it loads, then encodes everything to ``[]``).
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
EOS_ID = 256
PAD_ID = 257
VOCAB_SIZE = 258
MAX_LENGTH = 64
"""Tokens per sequence the demo model takes (its ``max_position_embeddings``)."""

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] != 'user' %}"
    "{{ raise_exception('the demo model knows only user messages, got ' + message['role']) }}"
    "{% endif %}"
    "{{ message['content'] }}"
    "{% endfor %}"
)
"""The demo model was trained on bare problems (``12+35=``): a chat renders as its user text."""


def _byte_symbols() -> list[str]:
    """GPT-2's byte-to-unicode table: the printable character standing for each byte 0..255."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    symbols: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for byte in range(256):
        if byte not in symbols:
            symbols[byte] = chr(256 + extra)
            extra += 1
    return [symbols[byte] for byte in range(256)]


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The demo tokenizer; token id ``b`` is byte ``b``, then ``<|endoftext|>`` and ``<|pad|>``."""
    vocab = {symbol: byte for byte, symbol in enumerate(_byte_symbols())}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    # use_regex=False: with no merges the split into words changes nothing, and Qwen's own
    # pre-tokenizer (regex split, then byte-level) gives the same ids.
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([EOS_TOKEN, PAD_TOKEN])
    # transformers 5 aliases PreTrainedTokenizerFast to TokenizersBackend, whose __init__ takes
    # unannotated (*args, **kwargs).
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # unannotated in transformers
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=MAX_LENGTH,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    assert tokenizer.eos_token_id == EOS_ID
    assert tokenizer.pad_token_id == PAD_ID
    assert len(tokenizer) == VOCAB_SIZE
    return tokenizer
