"""A second model that reads the student's token ids (a teacher, a process reward model) must
read them as the student does: the same vocabulary, the same special tokens. Checked on the
folders' tokenizer files before any process group starts."""

from __future__ import annotations

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from lrft.api.errors import ConfigError

_SPECIAL = ("bos_token_id", "eos_token_id", "pad_token_id")
"""The special tokens that mark where sequences start and end; the unknown token is left out:
it only matters for encoding text, and transformers sets it by the folder's model type."""


def _load(path: str, flag: str) -> PreTrainedTokenizerBase:
    try:
        tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as error:
        raise ConfigError(f"{flag} {path!r}: its tokenizer cannot be loaded ({error})") from error
    return tokenizer


def tokenizer_difference(
    student: PreTrainedTokenizerBase, other: PreTrainedTokenizerBase
) -> str | None:
    """How ``other`` reads token ids otherwise than ``student`` (the first difference found),
    or ``None`` when they read every id alike."""
    mine, theirs = student.get_vocab(), other.get_vocab()
    if len(mine) != len(theirs):
        return f"{len(theirs)} tokens in its vocabulary, the student's has {len(mine)}"
    by_id = {index: token for token, index in mine.items()}
    for token, index in sorted(theirs.items(), key=lambda item: item[1]):
        if by_id.get(index) != token:
            return f"token id {index} is {token!r}, the student's is {by_id.get(index)!r}"
    for name in _SPECIAL:
        if getattr(student, name, None) != getattr(other, name, None):
            return (
                f"its {name} is {getattr(other, name, None)!r}, the student's is "
                f"{getattr(student, name, None)!r}"
            )
    return None


def check_same_tokenizer(student_path: str, other_path: str, *, flag: str) -> None:
    """Raise ``ConfigError`` naming ``flag``, both folders and the first difference when the
    model in ``other_path`` would read the student's token ids otherwise."""
    difference = tokenizer_difference(_load(student_path, "pretrain"), _load(other_path, flag))
    if difference is not None:
        raise ConfigError(
            f"{flag} {other_path!r} does not share the student's tokenizer ({student_path!r}): "
            f"{difference}; it scores the student's token ids, so it must read them alike"
        )
