"""Judge templates: how a generative reward model (GRM) is asked, and how its verdict is read.

A :class:`JudgeTemplate` has two parts:

- ``prompt``: a format string whose slots are ``{prompt}``, ``{response}`` (required) and
  ``{reference}``; other braces are doubled, as in ``str.format`` (``\\boxed{{N}}``);
- ``verdict``: the form of the judge's answer, literal text around exactly one ``{score}`` slot
  (``\\boxed{{score}}`` is ``\\boxed{`` + slot + ``}``; ``<score>{score}</score>``). The judge
  may write anything before it; the *last* match in its output is the verdict.

``pointwise`` templates read a number in ``[min_score, max_score]``; ``pairwise`` ones compare the
response with the sample's reference answer (``{reference}`` is required) and read one of
``choices``, each mapped to a score (``A`` for "the response is better": 1). A verdict that does
not match, or a number outside the range, is *unparsable*: it scores ``unparsable_score`` and is
counted, never raised and never a silent 0.

Templates are built in (:data:`JUDGE_TEMPLATES`) or read from a JSON or YAML file of these keys.
The same template renders the judge prompts of ``lrft train-rm --generative`` (training a judge)
and of the GRM reward (``lrft train --grm_pretrain``), so a judge is asked what it learned.
"""

from __future__ import annotations

import json
import math
import re
import string
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import attrs

from lrft.api.errors import ConfigError

SCORE_SLOT = "{score}"
PROMPT_SLOTS = ("prompt", "response", "reference")
JudgeMode = Literal["pointwise", "pairwise"]
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"


def _prompt_slots(template: str, where: str) -> frozenset[str]:
    try:
        fields = [
            (name, spec, conversion)
            for _, name, spec, conversion in string.Formatter().parse(template)
            if name is not None
        ]
    except ValueError as error:  # an unmatched single brace
        raise ConfigError(
            f"{where} prompt is not a valid format string ({error}); write a literal brace as "
            "{{ or }}"
        ) from error
    for name, spec, conversion in fields:
        if name not in PROMPT_SLOTS or spec or conversion:
            raise ConfigError(
                f"{where} prompt has the slot {{{name}}}; the slots are "
                f"{', '.join('{' + slot + '}' for slot in PROMPT_SLOTS)} (write a literal brace "
                "as {{ or }})"
            )
    return frozenset(name for name, _, _ in fields)


def _choices(value: Mapping[str, float] | None) -> Mapping[str, float] | None:
    if value is None:
        return None
    return MappingProxyType({str(label): float(score) for label, score in value.items()})


@attrs.frozen(kw_only=True)
class JudgeTemplate:
    """A judge's prompt and verdict form (see the module docstring); checked when made, with a
    ``ConfigError`` naming the template, the value and the rule."""

    name: str
    prompt: str
    verdict: str
    mode: JudgeMode = "pointwise"
    min_score: float | None = None
    """Pointwise: the lowest score a verdict may give (unset: no bound)."""
    max_score: float | None = None
    choices: Mapping[str, float] | None = attrs.field(default=None, converter=_choices)
    """Pairwise: each label the judge may write, and the score it gives the response."""
    unparsable_score: float = 0.0
    """The score of a verdict that cannot be read (counted in the ``unparsable`` metric)."""

    def __attrs_post_init__(self) -> None:
        where = f"judge template {self.name!r}:"
        slots = _prompt_slots(self.prompt, where)
        if "response" not in slots:
            raise ConfigError(
                f"{where} prompt {self.prompt!r} has no {{response}} slot: the judge would never "
                "see the response it scores"
            )
        if self.verdict.count(SCORE_SLOT) != 1:
            raise ConfigError(
                f"{where} verdict {self.verdict!r} has {self.verdict.count(SCORE_SLOT)} "
                f"{SCORE_SLOT} slots; it must have exactly one, where the judge writes its score "
                "(for example \\boxed{{score}} or <score>{score}</score>)"
            )
        if self.mode not in ("pointwise", "pairwise"):
            raise ConfigError(f"{where} mode {self.mode!r} must be 'pointwise' or 'pairwise'")
        if not math.isfinite(self.unparsable_score):
            raise ConfigError(
                f"{where} unparsable_score must be finite, got {self.unparsable_score}"
            )
        if self.mode == "pairwise":
            self._check_pairwise(where, slots)
        else:
            self._check_pointwise(where)

    def _check_pairwise(self, where: str, slots: frozenset[str]) -> None:
        if "reference" not in slots:
            raise ConfigError(
                f"{where} a pairwise template compares the response with the reference answer: "
                "its prompt needs a {reference} slot"
            )
        if not self.choices:
            raise ConfigError(
                f"{where} a pairwise template needs choices: each label the judge may write "
                'with the score it gives the response (e.g. {"A": 1, "B": 0, "tie": 0.5})'
            )
        if self.min_score is not None or self.max_score is not None:
            raise ConfigError(f"{where} min_score and max_score apply to pointwise templates")
        for label, score in self.choices.items():
            if not label.strip() or not math.isfinite(score):
                raise ConfigError(f"{where} choice {label!r}: {score} needs a label and a score")

    def _check_pointwise(self, where: str) -> None:
        if self.choices is not None:
            raise ConfigError(f"{where} choices apply to pairwise templates")
        low, high = self.min_score, self.max_score
        for bound in (low, high):
            if bound is not None and not math.isfinite(bound):
                raise ConfigError(f"{where} score bounds must be finite, got {bound}")
        if low is not None and high is not None and not low < high:
            raise ConfigError(f"{where} min_score {low} must be below max_score {high}")

    @property
    def needs_reference(self) -> bool:
        """Whether the prompt shows the sample's reference answer (pairwise ones always do)."""
        return "reference" in _prompt_slots(self.prompt, "")

    def render(self, *, prompt: str, response: str, reference: str | None) -> str:
        """The judge prompt for one sample; ``ValueError`` when it needs a missing reference."""
        if reference is None and self.needs_reference:
            raise ValueError(f"judge template {self.name!r} shows the reference, and it is None")
        return self.prompt.format(prompt=prompt, response=response, reference=reference or "")

    def verdict_text(self, score: str) -> str:
        """The verdict form with ``score`` written into its slot (a training target's tail)."""
        return self.verdict.replace(SCORE_SLOT, score)

    @property
    def pattern(self) -> re.Pattern[str]:
        before, after = self.verdict.split(SCORE_SLOT)
        if self.choices is None:
            slot = _NUMBER
        else:  # longest first, so that "AB" is not read as "A"
            slot = "|".join(re.escape(c) for c in sorted(self.choices, key=len, reverse=True))
        return re.compile(re.escape(before) + r"\s*(" + slot + r")\s*" + re.escape(after))

    def parse(self, text: str) -> float | None:
        """The score of the last verdict in ``text``; ``None`` when there is none, or when a
        pointwise score is outside ``[min_score, max_score]``."""
        matches = self.pattern.findall(text)
        if not matches:
            return None
        token = str(matches[-1])
        if self.choices is not None:
            return self.choices[token]
        score = float(token)
        if (self.min_score is not None and score < self.min_score) or (
            self.max_score is not None and score > self.max_score
        ):
            return None
        return score


_POINTWISE_PROMPT = (
    "Rate how well the response answers the question, from {low} to {high}.\n\n"
    "Question: {{prompt}}\n\nResponse: {{response}}\n\nEnd with the rating as {form}.\n"
)
_PAIRWISE_PROMPT = (
    "Which answers the question better: response A or response B?\n\n"
    "Question: {prompt}\n\nResponse A: {response}\n\nResponse B: {reference}\n\n"
    "End with \\boxed{{A}}, \\boxed{{B}} or \\boxed{{tie}}.\n"
)

JUDGE_TEMPLATES: Mapping[str, JudgeTemplate] = MappingProxyType(
    {
        "pointwise-boxed": JudgeTemplate(
            name="pointwise-boxed",
            prompt=_POINTWISE_PROMPT.format(low=0, high=10, form="\\boxed{{N}}"),
            verdict="\\boxed{{score}}",
            min_score=0.0,
            max_score=10.0,
        ),
        "pointwise-score-tag": JudgeTemplate(
            name="pointwise-score-tag",
            prompt=_POINTWISE_PROMPT.format(low=0, high=10, form="<score>N</score>"),
            verdict="<score>{score}</score>",
            min_score=0.0,
            max_score=10.0,
        ),
        "pairwise-boxed": JudgeTemplate(
            name="pairwise-boxed",
            prompt=_PAIRWISE_PROMPT,
            verdict="\\boxed{{score}}",
            mode="pairwise",
            choices={"A": 1.0, "B": 0.0, "tie": 0.5},
        ),
    }
)
"""The built-in judge templates, by name. Each scores an unparsable verdict 0."""

_FILE_KEYS = frozenset(
    {"prompt", "verdict", "mode", "min_score", "max_score", "choices", "unparsable_score"}
)


def _read_mapping(path: Path) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        values = json.loads(text)
    else:
        import yaml  # type: ignore[import-untyped, unused-ignore]  # PyYAML is optional and untyped

        values = yaml.safe_load(text)
    if not isinstance(values, dict):
        raise ConfigError(f"judge template file {path} must hold a mapping, got {type(values)}")
    return values


def load_judge_template(spec: str) -> JudgeTemplate:
    """The built-in template named ``spec``, or the template in the JSON/YAML file ``spec``."""
    if spec in JUDGE_TEMPLATES:
        return JUDGE_TEMPLATES[spec]
    path = Path(spec)
    if not path.is_file():
        raise ConfigError(
            f"judge template {spec!r} is neither a built-in ({', '.join(JUDGE_TEMPLATES)}) nor "
            "a JSON or YAML file"
        )
    try:
        values = _read_mapping(path)
    except (OSError, ValueError) as error:
        raise ConfigError(f"judge template file {path} cannot be read: {error}") from error
    unknown = sorted(set(values) - _FILE_KEYS)
    if unknown or "prompt" not in values or "verdict" not in values:
        raise ConfigError(
            f"judge template file {path} has keys {sorted(values)}; it needs prompt and "
            f"verdict, and may have {', '.join(sorted(_FILE_KEYS - {'prompt', 'verdict'}))}"
            + (f" (unknown: {unknown})" if unknown else "")
        )
    try:
        return JudgeTemplate(name=str(path), **values)
    except (TypeError, ValueError) as error:
        if isinstance(error, ConfigError):
            raise
        raise ConfigError(f"judge template file {path}: {error}") from error
