"""Format rewards: does the response follow the template the prompt asked for?"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

import attrs

from lrft.rewards._checks import name_validator
from lrft.rewards.base import RewardOutput, RewardSample


def _compile(pattern: str | re.Pattern[str]) -> re.Pattern[str]:
    # DOTALL: templates span lines, and "." must cross them inside a reasoning block.
    return pattern if isinstance(pattern, re.Pattern) else re.compile(pattern, re.DOTALL)


@attrs.frozen(kw_only=True)
class RegexFormatReward:
    """1.0 when the response matches ``pattern``, else 0.0.

    ``match="full"`` requires the whole response to match (the usual meaning of "follows the
    template": nothing before or after it); ``"search"`` accepts a match anywhere. A pattern
    given as a string is compiled with ``re.DOTALL``.
    """

    pattern: re.Pattern[str] = attrs.field(converter=_compile)
    match: Literal["full", "search"] = attrs.field(
        default="full", validator=attrs.validators.in_(("full", "search"))
    )
    name: str = attrs.field(default="format", validator=name_validator)

    def matches(self, response: str) -> bool:
        if self.match == "full":
            return self.pattern.fullmatch(response) is not None
        return self.pattern.search(response) is not None

    def __call__(self, samples: Sequence[RewardSample]) -> RewardOutput:
        return RewardOutput(scores=[float(self.matches(s.response)) for s in samples])


# Each loop stops at the closing tag it cannot consume, so matching is linear in the response's
# length (a pattern such as ".*\S.*" inside the block would backtrack quadratically on failure).
_THINK_BLOCK = re.compile(r"\s*<think>((?:(?!</?think>).)*)</think>(.*)", re.DOTALL)
_ANSWER_TAG = re.compile(r"\s*<answer>((?:(?!</?answer>).)*)</answer>\s*", re.DOTALL)


@attrs.frozen(kw_only=True)
class ThinkFormatReward:
    """The R1-style template: 1.0 for one non-empty ``<think>...</think>`` block first, then the
    answer; else 0.0.

    Only whitespace may precede the block and no think tag may follow it. ``answer="boxed"``:
    the text after the block contains a ``\\boxed{``. ``answer="tag"``: after the block comes
    exactly one non-empty ``<answer>...</answer>`` and nothing else but whitespace.
    """

    answer: Literal["boxed", "tag"] = attrs.field(
        default="boxed", validator=attrs.validators.in_(("boxed", "tag"))
    )
    name: str = attrs.field(default="format", validator=name_validator)

    def matches(self, response: str) -> bool:
        block = _THINK_BLOCK.fullmatch(response)
        if block is None or not block.group(1).strip():
            return False
        rest = block.group(2)
        if "<think>" in rest or "</think>" in rest:
            return False
        if self.answer == "boxed":
            return "\\boxed{" in rest
        tag = _ANSWER_TAG.fullmatch(rest)
        return tag is not None and bool(tag.group(1).strip())

    def __call__(self, samples: Sequence[RewardSample]) -> RewardOutput:
        return RewardOutput(scores=[float(self.matches(s.response)) for s in samples])
