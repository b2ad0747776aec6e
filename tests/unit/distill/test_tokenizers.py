"""A teacher (or a process reward model) must read the student's token ids as the student does:
the check compares the folders' tokenizers and names the first difference."""

from __future__ import annotations

from pathlib import Path

import pytest

from lrft.api.errors import ConfigError
from lrft.demos.tokenizer import EOS_ID, PAD_ID, build_tokenizer
from lrft.distill.tokenizers import check_same_tokenizer


def _saved(directory: Path, **changes: str) -> str:
    tokenizer = build_tokenizer()
    extra = changes.pop("add", None)
    if extra is not None:
        tokenizer.add_tokens([extra])
    for name, value in changes.items():
        setattr(tokenizer, name, value)
    tokenizer.save_pretrained(directory)
    return str(directory)


def test_the_same_tokenizer_passes(tmp_path: Path) -> None:
    check_same_tokenizer(_saved(tmp_path / "a"), _saved(tmp_path / "b"), flag="teacher_pretrain")


def test_another_vocabulary_is_refused_naming_both_folders(tmp_path: Path) -> None:
    student, teacher = _saved(tmp_path / "student"), _saved(tmp_path / "teacher", add="<step>")
    with pytest.raises(ConfigError) as refused:
        check_same_tokenizer(student, teacher, flag="teacher_pretrain")
    message = str(refused.value)
    assert f"teacher_pretrain {teacher!r} does not share the student's tokenizer" in message
    assert repr(student) in message
    assert "259 tokens in its vocabulary, the student's has 258" in message


def test_other_special_tokens_are_refused(tmp_path: Path) -> None:
    # the same vocabulary, but the teacher would end sequences at the padding token
    student = _saved(tmp_path / "student")
    teacher = _saved(tmp_path / "teacher", eos_token="<|pad|>")
    with pytest.raises(
        ConfigError, match=f"its eos_token_id is {PAD_ID}, the student's is {EOS_ID}"
    ):
        check_same_tokenizer(student, teacher, flag="prm_pretrain")


def test_a_folder_without_a_tokenizer_is_named(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"teacher_pretrain .*empty.*cannot be loaded"):
        check_same_tokenizer(
            _saved(tmp_path / "a"), str(tmp_path / "empty"), flag="teacher_pretrain"
        )
