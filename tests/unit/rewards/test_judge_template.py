"""Judge templates: verdicts parsed pointwise (``\\boxed{7}``, ``<score>7</score>``) and pairwise,
the last verdict winning, out-of-range or missing verdicts unparsable; templates without a score
slot, a response slot or a reference slot refused with the rule; template files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lrft.api.errors import ConfigError
from lrft.rewards.judge_template import JUDGE_TEMPLATES, JudgeTemplate, load_judge_template

BOXED = JUDGE_TEMPLATES["pointwise-boxed"]
TAG = JUDGE_TEMPLATES["pointwise-score-tag"]
PAIRWISE = JUDGE_TEMPLATES["pairwise-boxed"]


@pytest.mark.parametrize(
    ("template", "text", "score"),
    [
        (BOXED, "The answer is right. \\boxed{7}", 7.0),
        (BOXED, "\\boxed{ 8.5 }", 8.5),
        (BOXED, "first \\boxed{2}, on reflection \\boxed{9}", 9.0),  # the last verdict
        (BOXED, "\\boxed{11}", None),  # above max_score 10
        (BOXED, "\\boxed{-1}", None),  # below min_score 0
        (BOXED, "I give it a 7", None),
        (BOXED, "\\boxed{seven}", None),
        (BOXED, "<score>7</score>", None),  # another template's form
        (TAG, "reasoning... <score>7</score>", 7.0),
        (TAG, "<score>10</score>", 10.0),
        (TAG, "<score>7", None),
        (PAIRWISE, "B is shorter but A is right: \\boxed{A}", 1.0),
        (PAIRWISE, "\\boxed{B}", 0.0),
        (PAIRWISE, "\\boxed{tie}", 0.5),
        (PAIRWISE, "\\boxed{C}", None),
        (PAIRWISE, "\\boxed{7}", None),
    ],
)
def test_verdicts_parse_as_the_template_declares(
    template: JudgeTemplate, text: str, score: float | None
) -> None:
    assert template.parse(text) == score


def test_render_fills_the_slots_and_keeps_literal_braces() -> None:
    text = BOXED.render(prompt="1+1={x}", response="2", reference=None)
    assert "Question: 1+1={x}" in text
    assert "Response: 2" in text
    assert "\\boxed{N}" in text  # the doubled braces of the template are literal
    pair = PAIRWISE.render(prompt="q", response="mine", reference="gold")
    assert "Response A: mine" in pair
    assert "Response B: gold" in pair
    with pytest.raises(ValueError, match="shows the reference, and it is None"):
        PAIRWISE.render(prompt="q", response="mine", reference=None)
    assert BOXED.verdict_text("7") == "\\boxed{7}"
    assert BOXED.parse(BOXED.verdict_text("7")) == 7


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"verdict": "Score: N"},
            r"verdict 'Score: N' has 0 \{score\} slots; it must have exactly one",
        ),
        ({"verdict": "{score}/{score}"}, r"has 2 \{score\} slots"),
        ({"prompt": "Rate {prompt}"}, r"has no \{response\} slot"),
        ({"prompt": "Rate {question} {response}"}, r"has the slot \{question\}; the slots are"),
        ({"prompt": "Rate {response"}, r"not a valid format string"),
        ({"mode": "listwise"}, r"mode 'listwise' must be 'pointwise' or 'pairwise'"),
        ({"mode": "pairwise", "choices": {"A": 1.0}}, r"needs a \{reference\} slot"),
        ({"min_score": 5.0, "max_score": 5.0}, r"min_score 5.0 must be below max_score 5.0"),
        ({"choices": {"A": 1.0}}, r"choices apply to pairwise templates"),
    ],
)
def test_bad_templates_name_the_value_and_the_rule(
    changes: dict[str, object], message: str
) -> None:
    values: dict[str, object] = {
        "name": "mine",
        "prompt": "Rate {prompt} -> {response}",
        "verdict": "<score>{score}</score>",
    }
    values.update(changes)
    with pytest.raises(ConfigError, match=r"judge template 'mine': .*" + message):
        JudgeTemplate(**values)  # type: ignore[arg-type]  # the values are the fields'


def test_pairwise_needs_choices() -> None:
    with pytest.raises(ConfigError, match="a pairwise template needs choices"):
        JudgeTemplate(
            name="p", prompt="{response} {reference}", verdict="[{score}]", mode="pairwise"
        )


def test_template_files(tmp_path: Path) -> None:
    spec = {
        "prompt": "{prompt}{response}|",
        "verdict": "[[{score}]]",
        "min_score": 0,
        "max_score": 5,
        "unparsable_score": -1,
    }
    path = tmp_path / "judge.json"
    path.write_text(json.dumps(spec))
    template = load_judge_template(str(path))
    assert template.parse("ok [[4]]") == 4.0
    assert template.parse("[[6]]") is None
    assert template.unparsable_score == -1.0
    assert template.name == str(path)
    yaml_path = tmp_path / "judge.yaml"
    yaml_path.write_text("prompt: '{response}?'\nverdict: 'score={score};'\n")
    assert load_judge_template(str(yaml_path)).parse("score=3;") == 3.0

    path.write_text(json.dumps({**spec, "verdict": "[[N]]"}))
    with pytest.raises(ConfigError, match=re.escape("verdict '[[N]]' has 0 {score} slots")):
        load_judge_template(str(path))
    path.write_text(json.dumps({**spec, "scale": 10}))
    with pytest.raises(ConfigError, match=r"unknown: \['scale'\]"):
        load_judge_template(str(path))
    with pytest.raises(ConfigError, match=r"neither a built-in .* nor a JSON or YAML file"):
        load_judge_template(str(tmp_path / "missing.json"))
