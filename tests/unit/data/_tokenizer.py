"""A small byte-level BPE tokenizer built in-process, with a chat template set here.

Its merges are learned from lowercase words and spaces only, so any text made of digits,
punctuation and uppercase letters encodes to exactly one token per UTF-8 byte: prompt lengths in
the tests can be counted by hand. The chat-format special tokens are single tokens.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

BOS = "<s>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
PAD = "<|endoftext|>"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CORPUS = [
    "the cat sat on the mat",
    "what is the answer to the question",
    "be brief and answer in one word",
    "user assistant system",
]


def build_tokenizer(*, chat_template: str | None = CHAT_TEMPLATE) -> PreTrainedTokenizerFast:
    """A byte-level BPE (vocabulary 300) whose encoder prepends ``<s>`` with special tokens on."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=[PAD, IM_START, IM_END, BOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_CORPUS, trainer)
    bos_id = backend.token_to_id(BOS)
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, bos_id)]
    )
    # transformers 5 aliases PreTrainedTokenizerFast to TokenizersBackend, whose __init__ takes
    # unannotated (*args, **kwargs).
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend, bos_token=BOS, eos_token=IM_END, pad_token=PAD
    )
    tokenizer.chat_template = chat_template
    return tokenizer
