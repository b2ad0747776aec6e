"""A byte-level BPE tokenizer with merges, built in-process, and chat templates for the tests.

``TOOL_TEMPLATE`` follows the structure of Qwen2.5's template for tools: tool results become a
user turn of ``<tool_response>`` blocks, consecutive results merged into one turn. The merges are
learned from words of the reference conversations, so encodings there are not one token per byte
and segment boundaries are really exercised.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

PAD = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

TOOL_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1]['role'] != 'tool' %}"
    "{{- '<|im_start|>user' }}"
    "{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

TRIM_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""Strips every message's whitespace, as Llama 3's template does."""

THINK_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- set content = message['content'] %}"
    "{%- if message['role'] == 'assistant' and not loop.last and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1] %}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""Drops the reasoning of every assistant turn but the last, as Qwen3's template does."""

_CORPUS = [
    "you add numbers with a calculator",
    "what is the answer the result is",
    "calculator calculator result tool_response",
    "the answer is 83810205 12345 6789 the cat sat on the mat",
    "print the sum of the numbers python",
]


def build_tokenizer(chat_template: str = TOOL_TEMPLATE) -> PreTrainedTokenizerFast:
    """Vocabulary 400: bytes, merges of the corpus, ``<|endoftext|>`` (pad), the ChatML tokens.

    Its EOS is ``<|im_end|>``, the template's end of turn.
    """
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=[PAD, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_CORPUS, trainer)
    # transformers 5 aliases PreTrainedTokenizerFast to TokenizersBackend, whose __init__ takes
    # unannotated (*args, **kwargs).
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # unannotated in transformers
        tokenizer_object=backend, eos_token=IM_END, pad_token=PAD
    )
    tokenizer.chat_template = chat_template
    return tokenizer
