"""Loading prompt datasets end to end: which rows are kept, their exact token ids, and errors.

Lengths are counted by hand: the test tokenizer encodes text without lowercase letters to one
token per byte (see ``_tokenizer.py``), so ``"Q: 12345"`` is 8 tokens.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from transformers import PreTrainedTokenizerFast

from lrft.api import ConfigError
from lrft.data import PromptDataConfig, PromptDataError, PromptStats, load_prompt_dataset
from tests.unit.data._tokenizer import BOS, IM_START
from tests.unit.data.test_sources import write_datasets_folder, write_jsonl, write_parquet

ROWS: list[dict[str, Any]] = [
    {"question": "1+1", "answer": "2", "solution": "S0", "level": 1},  # "Q: 1+1": 6 tokens
    {"question": "12345678+1", "answer": "X", "solution": "S1", "level": 3},  # 13 tokens
    {"question": "12345", "answer": "12345", "solution": "S2", "level": 2},  # 8: at the limit
    {"question": "123456", "answer": "123456", "solution": "S3", "level": 2},  # 9: one over
    {"question": "7", "answer": "7", "solution": "S4", "level": 1},  # 4 tokens
]


def config(path: Path, **overrides: Any) -> PromptDataConfig:
    settings: dict[str, Any] = {
        "prompt_data": path,
        "input_key": "question",
        "label_key": "answer",
        "reference_key": "solution",
        "input_template": "Q: {}",
        "max_prompt_length": 8,
    }
    settings.update(overrides)
    return PromptDataConfig(**settings)


def encode(tokenizer: PreTrainedTokenizerFast, text: str, special: bool = False) -> tuple[int, ...]:
    return tuple(tokenizer.encode(text, add_special_tokens=special))


def test_the_counting_rule_the_length_tests_rely_on(tokenizer: PreTrainedTokenizerFast) -> None:
    for text in ("Q: 1+1", "Q: 12345678+1", "Q: 12345", "Q: 123456", "Q: 7"):
        assert len(encode(tokenizer, text)) == len(text.encode())


def test_prompts_over_the_limit_are_dropped_and_counted_not_truncated(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", ROWS)
    with caplog.at_level(logging.WARNING, logger="lrft.data"):
        dataset = load_prompt_dataset(config(path), tokenizer)

    assert [sample.source_index for sample in dataset] == [0, 2, 4]
    assert [sample.prompt_text for sample in dataset] == ["Q: 1+1", "Q: 12345", "Q: 7"]
    for sample in dataset:
        assert sample.prompt_token_ids == encode(tokenizer, sample.prompt_text)
    assert [sample.prompt_length for sample in dataset] == [6, 8, 4]
    assert [sample.label for sample in dataset] == ["2", "12345", "7"]
    assert [sample.reference for sample in dataset] == ["S0", "S2", "S4"]
    assert [dict(sample.metadata) for sample in dataset] == [
        {"level": 1},
        {"level": 2},
        {"level": 1},
    ]

    assert dataset.stats == PromptStats(
        source=str(path),
        rows=5,
        kept=3,
        max_prompt_length=8,
        dropped_too_long=(1, 3),
        dropped_empty=(),
        longest_kept=8,
    )
    assert dataset.stats.as_metrics() == {
        "data/rows": 5.0,
        "data/kept": 3.0,
        "data/dropped_too_long": 2.0,
        "data/dropped_empty": 0.0,
        "data/dropped_fraction": 0.4,
        "data/longest_kept_prompt": 8.0,
    }
    assert "kept 3 of 5 prompts; dropped 2 longer than max_prompt_length=8" in caplog.text
    assert dataset.select([2, 0]) == (dataset[2], dataset[0])


def test_no_limit_keeps_everything_whole(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", ROWS)
    dataset = load_prompt_dataset(config(path, max_prompt_length=None), tokenizer)
    assert [sample.prompt_length for sample in dataset] == [6, 13, 8, 9, 4]
    assert dataset.stats.dropped == 0


def test_empty_prompts_are_dropped_and_counted(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    rows = [{"question": "", "answer": "a"}, {"question": "1", "answer": "b"}]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    dataset = load_prompt_dataset(config(path, input_template=None, reference_key=None), tokenizer)
    assert [sample.source_index for sample in dataset] == [1]
    assert dataset.stats.dropped_empty == (0,)


def test_chat_template_token_ids_equal_the_tokenizers_encoding_of_the_hand_written_prompt(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", ROWS[:1])
    dataset = load_prompt_dataset(
        config(path, apply_chat_template=True, system_prompt="Be brief.", max_prompt_length=None),
        tokenizer,
    )
    expected = (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nQ: 1+1<|im_end|>\n<|im_start|>assistant\n"
    )
    (sample,) = dataset
    assert sample.prompt_text == expected
    assert sample.prompt_token_ids == encode(tokenizer, expected)
    # The chat markers stay single special tokens, and nothing (no BOS) is added in front.
    assert sample.prompt_token_ids[0] == tokenizer.convert_tokens_to_ids(IM_START)
    assert sample.prompt_token_ids.count(tokenizer.convert_tokens_to_ids(IM_START)) == 3


def test_add_special_tokens_prepends_the_tokenizers_bos(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", ROWS)
    dataset = load_prompt_dataset(config(path, add_special_tokens=True), tokenizer)
    bos = tokenizer.convert_tokens_to_ids(BOS)
    # BOS counts towards the limit: "Q: 12345" is now 9 tokens and dropped.
    assert [sample.source_index for sample in dataset] == [0, 4]
    assert dataset[0].prompt_token_ids == (bos, *encode(tokenizer, "Q: 1+1"))


def test_max_samples_reads_only_the_first_rows(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", ROWS)
    dataset = load_prompt_dataset(config(path, max_samples=3), tokenizer)
    assert [sample.source_index for sample in dataset] == [0, 2]
    assert dataset.stats.rows == 3


@pytest.mark.parametrize("kind", ["parquet", "datasets"])
def test_parquet_and_datasets_folders_load_the_same_samples_as_jsonl(
    kind: str, tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    jsonl = load_prompt_dataset(config(write_jsonl(tmp_path / "p.jsonl", ROWS)), tokenizer)
    if kind == "parquet":
        other_path = write_parquet(tmp_path / "p.parquet", ROWS)
    else:
        other_path = write_datasets_folder(tmp_path / "ds", rows=ROWS)
    other = load_prompt_dataset(config(other_path), tokenizer)
    assert other.samples == jsonl.samples
    assert other.fingerprint == jsonl.fingerprint


def test_fingerprint_changes_with_what_was_kept(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", ROWS)
    base = load_prompt_dataset(config(path), tokenizer)
    assert base.fingerprint == load_prompt_dataset(config(path), tokenizer).fingerprint
    assert (
        base.fingerprint
        != load_prompt_dataset(config(path, max_prompt_length=9), tokenizer).fingerprint
    )
    assert (
        base.fingerprint
        != load_prompt_dataset(config(path, input_template="{}"), tokenizer).fingerprint
    )


@pytest.mark.parametrize(
    ("overrides", "option", "key"),
    [
        ({"input_key": "prompt"}, "input_key", "prompt"),
        ({"label_key": "gold"}, "label_key", "gold"),
        ({"reference_key": "ref"}, "reference_key", "ref"),
    ],
)
def test_a_missing_key_names_the_key_the_file_the_row_and_the_keys_present(
    overrides: dict[str, str],
    option: str,
    key: str,
    tmp_path: Path,
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", ROWS)
    message = (
        f"{option} '{key}' is missing in {path} row 0 (line 1); "
        "keys present: 'question', 'answer', 'solution', 'level'"
    )
    with pytest.raises(PromptDataError) as raised:
        load_prompt_dataset(config(path, **overrides), tokenizer)
    assert str(raised.value) == message


def test_a_key_missing_from_a_row_that_would_be_dropped_still_fails(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    rows = [ROWS[0], {"question": "12345678+1", "solution": "S1"}]  # too long, and no answer
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    with pytest.raises(
        PromptDataError, match=r"label_key 'answer' is missing in .* row 1 \(line 2\)"
    ):
        load_prompt_dataset(config(path), tokenizer)


def test_a_missing_parquet_column_names_the_file_and_row(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    path = write_parquet(tmp_path / "p.parquet", ROWS)
    with pytest.raises(
        PromptDataError, match=r"input_key 'prompt' is missing in .*p\.parquet row 0;"
    ):
        load_prompt_dataset(config(path, input_key="prompt"), tokenizer)


def test_no_prompt_left_is_an_error(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", ROWS)
    with pytest.raises(PromptDataError, match=r"no prompt is left: .* kept 0 of 5"):
        load_prompt_dataset(config(path, max_prompt_length=3), tokenizer)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    with pytest.raises(PromptDataError, match="has no rows"):
        load_prompt_dataset(config(empty), tokenizer)


def test_config_rejects_bad_values_when_made(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    with pytest.raises(ConfigError, match="max_prompt_length must be a positive integer"):
        config(path, max_prompt_length=0)
    with pytest.raises(ConfigError, match="max_samples must be a positive integer"):
        config(path, max_samples=-1)
    with pytest.raises(ConfigError, match="input_key must be a non-empty string"):
        config(path, input_key="")
    with pytest.raises(ConfigError, match="exactly one placeholder"):
        config(path, input_template="no placeholder")
    with pytest.raises(ConfigError, match="system_prompt needs apply_chat_template"):
        config(path, system_prompt="S")


def test_samples_are_frozen_and_their_metadata_read_only(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    sample = load_prompt_dataset(config(write_jsonl(tmp_path / "p.jsonl", ROWS)), tokenizer)[0]
    with pytest.raises(TypeError):
        sample.metadata["level"] = 5  # type: ignore[index]  # the point: it is a read-only view
    assert json.loads(json.dumps(dict(sample.metadata))) == {"level": 1}
