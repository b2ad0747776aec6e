"""Rewards: a batch of samples in, one finite score per sample plus named metrics out.

- the contract: :class:`RewardFn`, :class:`RewardSample`, :class:`RewardOutput`, and
  :func:`compute_rewards`, the checked call that names the reward and the sample at fault
  (:class:`RewardError`) instead of scoring a failure or a NaN;
- built-ins: math answer verification with math-verify (:class:`MathVerifyReward`, answers
  extracted from ``\\boxed{...}`` or GSM8K's ``####``), format rewards
  (:class:`ThinkFormatReward`, :class:`RegexFormatReward`), length shaping
  (:class:`OverlongPenalty`), scalar reward models (:class:`SequenceClassifierReward`),
  generative reward models judging through a rollout engine (:class:`GenerativeReward`, its
  verdict read by a :class:`JudgeTemplate`), a remote reward service (:class:`RemoteReward`, in
  lrft's or OpenRLHF's format), plain functions (:class:`PerSampleReward`);
- :class:`CombinedReward`: weighted rewards chosen per sample by its data label.

:class:`RemoteReward` needs ``httpx`` and :class:`MathVerifyReward` needs ``math-verify``; both
are imported only when those classes are first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lrft.rewards.answers import (
    ANSWER_FORMATS,
    AnswerFormat,
    extract_answer,
    gsm8k_answer,
    last_boxed,
    reference_answer,
)
from lrft.rewards.base import (
    PerSampleReward,
    RewardError,
    RewardFn,
    RewardOutput,
    RewardSample,
    compute_rewards,
)
from lrft.rewards.combined import CombinedReward, Weighted
from lrft.rewards.format import RegexFormatReward, ThinkFormatReward
from lrft.rewards.generative import GenerativeReward, judge_prompt_ids
from lrft.rewards.judge_template import JUDGE_TEMPLATES, JudgeTemplate, load_judge_template
from lrft.rewards.length import RESPONSE_LENGTH_KEY, OverlongPenalty, characters, generated_tokens
from lrft.rewards.math_reward import MathVerifyReward
from lrft.rewards.reward_model import (
    ModuleHandle,
    SequenceClassifierReward,
    TextTokenizer,
    prompt_then_response,
)

if TYPE_CHECKING:
    from lrft.rewards.remote import RemoteReward


def __getattr__(name: str) -> Any:
    # httpx is imported only by the remote reward: importing lrft.rewards must not need it.
    if name == "RemoteReward":
        try:
            from lrft.rewards.remote import RemoteReward
        except ImportError as error:
            raise ImportError(
                f"RemoteReward needs httpx: pip install 'httpx>=0.28' ({error})"
            ) from error
        return RemoteReward
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ANSWER_FORMATS",
    "JUDGE_TEMPLATES",
    "RESPONSE_LENGTH_KEY",
    "AnswerFormat",
    "CombinedReward",
    "GenerativeReward",
    "JudgeTemplate",
    "MathVerifyReward",
    "ModuleHandle",
    "OverlongPenalty",
    "PerSampleReward",
    "RegexFormatReward",
    "RemoteReward",
    "RewardError",
    "RewardFn",
    "RewardOutput",
    "RewardSample",
    "SequenceClassifierReward",
    "TextTokenizer",
    "ThinkFormatReward",
    "Weighted",
    "characters",
    "compute_rewards",
    "extract_answer",
    "generated_tokens",
    "gsm8k_answer",
    "judge_prompt_ids",
    "last_boxed",
    "load_judge_template",
    "prompt_then_response",
    "reference_answer",
]
