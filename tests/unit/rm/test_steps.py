"""Process reward model data and loss: step-labelled rows tokenised as ``lrft train`` scores
them (prompt ids, then response ids; each step's label at the token where it ends), bad rows
named, and the step cross-entropy against a hand computation and a plain transformers forward."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from lrft.api.errors import ConfigError
from lrft.data import PromptFormat
from lrft.demos.tokenizer import PAD_ID, build_tokenizer
from lrft.rm.data import StepExample
from lrft.rm.loss import step_cross_entropy
from lrft.rm.objectives import StepObjective
from lrft.rm.steps import StepColumns, load_step_examples
from tests.unit.rm.models import tiny_token_classifier

TOKENIZER = build_tokenizer()  # one token per byte
ROWS: list[dict[str, object]] = [
    {"prompt": "12+35+8=", "steps": ["12+35=47", "47+8=55"], "labels": [1, 1]},
    {"question": "x", "prompt": "9+9+1=", "steps": ["9+9=17", "17+1=18"], "labels": [0, True]},
]


def _load(path: Path, rows: list[dict[str, object]], **kwargs: object) -> list[StepExample]:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    options: dict[str, object] = {
        "separator": ";",
        "columns": StepColumns(),
        "prompt_format": PromptFormat(),
        "tokenizer": TOKENIZER,
    } | kwargs
    return list(load_step_examples(str(path), **options).examples)  # type: ignore[arg-type]  # a mapping of mixed option values


def test_rows_become_prompt_then_response_with_labels_at_step_ends(tmp_path: Path) -> None:
    first, second = _load(tmp_path / "steps.jsonl", ROWS)
    text = "12+35+8=" + "12+35=47;47+8=55"
    assert first.input_ids == tuple(TOKENIZER.encode(text, add_special_tokens=False))
    # the prompt is 8 tokens; "12+35=47;" ends at response token 8, "47+8=55" at 15
    assert first.positions == (16, 23)
    assert first.labels == (1.0, 1.0)
    assert second.positions == (6 + 6, 6 + 13)
    assert second.labels == (0.0, 1.0)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"prompt": "p", "steps": ["a;b", "c"], "labels": [1, 0]}, r"its 2 steps joined by ';' read as 3 steps"),
        ({"prompt": "p", "steps": ["a", "b"], "labels": [1]}, r"must be a list of 2 labels"),
        ({"prompt": "p", "steps": ["a"], "labels": [2]}, r"labels lie in \[0, 1\]"),
        ({"prompt": "p", "steps": "a;b", "labels": [1]}, r"--steps_key 'steps' .* non-empty list of strings"),
        ({"prompt": "p", "labels": [1]}, r"--steps_key 'steps' is missing in .* row 0"),
    ],
)  # fmt: skip
def test_a_bad_row_is_named(tmp_path: Path, row: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _load(tmp_path / "bad.jsonl", [row])


def test_the_step_cross_entropy_by_hand() -> None:
    logits = torch.tensor([0.0, 2.0, -1.0], requires_grad=True)
    stats = step_cross_entropy(logits, torch.tensor([1.0, 0.0, 0.25]))
    sigmoid = [0.5, 1 / (1 + math.exp(-2.0)), 1 / (1 + math.exp(1.0))]
    expected = -(
        math.log(sigmoid[0])
        + math.log(1 - sigmoid[1])
        + 0.25 * math.log(sigmoid[2])
        + 0.75 * math.log(1 - sigmoid[2])
    )
    assert float(stats.loss_sum.detach()) == pytest.approx(expected, rel=1e-6)
    assert stats.steps == 3
    assert stats.correct == 1.0  # 0 > 0 is false for label 1; 2 > 0 for label 0; -1 for 0.25
    stats.loss_sum.backward()  # type: ignore[no-untyped-call]  # unannotated in torch
    assert logits.grad is not None


def test_the_objective_reads_each_step_at_its_last_token() -> None:
    model = tiny_token_classifier(seed=3)
    model.train(False)
    examples = [
        StepExample(input_ids=(5, 6, 7, 8, 9), positions=(2, 4), labels=(1.0, 0.0)),
        StepExample(input_ids=(10, 11, 12), positions=(2,), labels=(1.0,)),
    ]
    objective = StepObjective(pad_id=PAD_ID)
    measured = objective.measure(model, examples, torch.device("cpu"))
    expected = 0.0
    with torch.no_grad():
        for example in examples:  # each alone, unpadded
            logits = model(input_ids=torch.tensor([example.input_ids])).logits[0, :, 0]
            picked = logits[list(example.positions)]
            expected += float(
                F.binary_cross_entropy_with_logits(
                    picked, torch.tensor(example.labels), reduction="sum"
                )
            )
    assert float(measured.loss_sum.detach()) == pytest.approx(expected, rel=1e-5)
    assert objective.size(examples) == 3
    assert measured.counts["steps"] == 3.0
    summary = objective.summary({"steps": 3.0, "correct_steps": 2.0}, 1.5)
    assert summary == {"loss": 0.5, "step_accuracy": 2 / 3}
