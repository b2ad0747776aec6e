"""Reward-model data: preference pairs and judge examples from JSONL, Parquet and ``datasets``
folders, tokenised as the rewards score them; every bad row is a ``ConfigError`` naming the
column, the source, the row and the columns it has; too-long examples dropped and counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerFast

from lrft.api.errors import ConfigError
from lrft.data import PromptFormat
from lrft.demos.tokenizer import build_tokenizer
from lrft.rewards.judge_template import JUDGE_TEMPLATES, JudgeTemplate
from lrft.rm import Columns, load_judge_examples, load_preference_pairs

ROWS = [
    {"prompt": "12+35=", "chosen": "47", "rejected": "37", "gap": 1.0},
    {"prompt": "9+9=", "chosen": "18", "rejected": "8", "gap": 0.5},
    {"prompt": "1+1=", "chosen": "2", "rejected": "a long wrong answer", "gap": 0.0},
]
TEMPLATE = JudgeTemplate(name="t", prompt="{prompt}{response}|", verdict="<{score}>")


@pytest.fixture
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer()


def _jsonl(path: Path, rows: list[dict[str, object]]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_pairs_are_prompt_plus_response_with_margins(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    path = _jsonl(tmp_path / "pairs.jsonl", ROWS)
    data = load_preference_pairs(
        path, columns=Columns(margin="gap"), prompt_format=PromptFormat(), tokenizer=tokenizer
    )
    first = data[0]
    # as SequenceClassifierReward tokenises prompt + response: with the special tokens
    assert first.chosen == tuple(tokenizer.encode("12+35=47", add_special_tokens=True))
    assert first.rejected == tuple(tokenizer.encode("12+35=37", add_special_tokens=True))
    assert [pair.margin for pair in data.examples] == [1.0, 0.5, 0.0]
    # without a margin column every margin is 0
    plain = load_preference_pairs(
        path, columns=Columns(), prompt_format=PromptFormat(), tokenizer=tokenizer
    )
    assert [pair.margin for pair in plain.examples] == [0.0] * 3
    assert plain.fingerprint != data.fingerprint  # margins are part of what is trained on


def test_parquet_and_datasets_folders_read_the_same_pairs(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    pyarrow = pytest.importorskip("pyarrow")
    parquet = pytest.importorskip("pyarrow.parquet")
    datasets = pytest.importorskip("datasets")

    jsonl = _jsonl(tmp_path / "pairs.jsonl", ROWS)
    parquet.write_table(pyarrow.Table.from_pylist(ROWS), tmp_path / "pairs.parquet")
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "pairs_ds"))
    expected = load_preference_pairs(
        jsonl, columns=Columns(), prompt_format=PromptFormat(), tokenizer=tokenizer
    )
    for source in ("pairs.parquet", "pairs_ds"):
        got = load_preference_pairs(
            str(tmp_path / source),
            columns=Columns(),
            prompt_format=PromptFormat(),
            tokenizer=tokenizer,
        )
        assert got.examples == expected.examples
        assert got.fingerprint == expected.fingerprint


def test_chat_and_input_templates_format_the_prompt_as_lrft_train_does(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    tokenizer.chat_template = "<user>{{ messages[0]['content'] }}</user>"
    path = _jsonl(tmp_path / "pairs.jsonl", ROWS[:1])
    formatted = load_preference_pairs(
        path,
        columns=Columns(),
        prompt_format=PromptFormat(apply_chat_template=True, input_template="Q: {}"),
        tokenizer=tokenizer,
    )
    assert tokenizer.decode(list(formatted[0].chosen)) == "<user>Q: 12+35=</user>47"


def test_long_pairs_are_dropped_and_counted(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    path = _jsonl(tmp_path / "pairs.jsonl", ROWS)
    data = load_preference_pairs(
        path, columns=Columns(), prompt_format=PromptFormat(), tokenizer=tokenizer, max_len=10
    )
    assert len(data) == 2
    assert data.dropped == (2,)
    assert "2 examples kept, 1 dropped as too long" in data.summary()
    with pytest.raises(ConfigError, match="every one of its 3 examples has more than max_len 3"):
        load_preference_pairs(
            path, columns=Columns(), prompt_format=PromptFormat(), tokenizer=tokenizer, max_len=3
        )


@pytest.mark.parametrize(
    ("row", "columns", "message"),
    [
        (
            {"prompt": "1+1=", "chosen": "2"},
            Columns(),
            r"--rejected_key 'rejected' is missing in .*pairs.jsonl row 1 \(line 2\); columns "
            r"present: 'prompt', 'chosen'",
        ),
        (
            {"question": "1+1=", "chosen": "2", "rejected": "3"},
            Columns(),
            r"--prompt_key 'prompt' is missing",
        ),
        (
            {"prompt": "1+1=", "chosen": 2, "rejected": "3"},
            Columns(),
            r"--chosen_key 'chosen' in .* must be a string, got int",
        ),
        (
            {"prompt": "1+1=", "chosen": "2", "rejected": "3", "gap": "big"},
            Columns(margin="gap"),
            r"--margin_key 'gap' in .* must be a finite number, got 'big'",
        ),
    ],
)
def test_a_bad_row_is_named_before_training(
    tmp_path: Path,
    tokenizer: PreTrainedTokenizerFast,
    row: dict[str, object],
    columns: Columns,
    message: str,
) -> None:
    path = _jsonl(tmp_path / "pairs.jsonl", [ROWS[0], row])
    with pytest.raises(ConfigError, match=message):
        load_preference_pairs(
            path, columns=columns, prompt_format=PromptFormat(), tokenizer=tokenizer
        )


def test_judge_examples_end_with_the_verdict_and_eos(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    path = _jsonl(
        tmp_path / "judge.jsonl", [{"prompt": "1+1=", "response": "2", "verdict": "ok <7>"}]
    )
    data = load_judge_examples(
        path,
        columns=Columns(),
        template=TEMPLATE,
        prompt_format=PromptFormat(),
        chat=False,
        tokenizer=tokenizer,
    )
    example = data[0]
    prompt = tokenizer.encode("1+1=2|", add_special_tokens=True)
    assert list(example.input_ids[: example.target_start]) == prompt
    assert list(example.input_ids[example.target_start :]) == [
        *tokenizer.encode("ok <7>", add_special_tokens=False),
        tokenizer.eos_token_id,
    ]


def test_judge_rows_are_checked_against_the_template(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    path = _jsonl(
        tmp_path / "judge.jsonl", [{"prompt": "1+1=", "response": "2", "verdict": "seven"}]
    )
    with pytest.raises(
        ConfigError,
        match=r"--verdict_key 'verdict' in .* is 'seven', which judge template 't' cannot parse",
    ):
        load_judge_examples(
            path,
            columns=Columns(),
            template=TEMPLATE,
            prompt_format=PromptFormat(),
            chat=False,
            tokenizer=tokenizer,
        )
    pairwise = JUDGE_TEMPLATES["pairwise-boxed"]
    path = _jsonl(
        tmp_path / "pairs.jsonl", [{"prompt": "q", "response": "r", "verdict": "\\boxed{A}"}]
    )
    with pytest.raises(ConfigError, match=r"--reference_key 'gold' is missing"):
        load_judge_examples(
            path,
            columns=Columns(reference="gold"),
            template=pairwise,
            prompt_format=PromptFormat(),
            chat=False,
            tokenizer=tokenizer,
        )
