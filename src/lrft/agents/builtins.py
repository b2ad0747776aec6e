"""The factories of the built-in tools and environment, as the registry names them."""

from __future__ import annotations

from typing import Any

import attrs

from lrft.agents.chat import ChatTemplateTranscript, TextTranscript, Transcript
from lrft.agents.registry import EnvironmentSetup
from lrft.agents.sandbox import Isolation, SandboxLimits
from lrft.agents.tool_env import Scorer, ToolCallEnvironment
from lrft.agents.tools import Calculator, PythonTool
from lrft.api.episodes import EpisodeTask
from lrft.api.errors import ConfigError
from lrft.rewards import RewardFn, RewardSample, compute_rewards

_LIMITS = frozenset(field.name for field in attrs.fields(SandboxLimits))


def calculator_tool() -> Calculator:
    """``calculator``: exact arithmetic, no options."""
    return Calculator()


def python_tool(*, isolation: Isolation = "auto", **limits: Any) -> PythonTool:
    """``python``: the sandboxed Python tool; options are ``isolation`` and the fields of
    :class:`~lrft.agents.sandbox.SandboxLimits` (``wall_time_s=5``, ``memory_bytes=...``)."""
    unknown = sorted(set(limits) - _LIMITS)
    if unknown:
        raise ConfigError(
            f"unknown options of the python tool: {unknown}; known: isolation, "
            f"{', '.join(sorted(_LIMITS))}"
        )
    return PythonTool(SandboxLimits(**limits), isolation=isolation)


def reward_scorer(reward: RewardFn) -> Scorer:
    """A scorer that asks a reward function (:mod:`lrft.rewards`) about the final answer."""

    def score(task: EpisodeTask, answer: str) -> float:
        prompt = (
            task.prompt
            if isinstance(task.prompt, str)
            else "\n".join(message.content for message in task.prompt)
        )
        sample = RewardSample(
            prompt=prompt,
            response=answer,
            label=task.label,
            reference=task.reference,
            metadata=task.metadata,
        )
        return compute_rewards(reward, [sample]).scores[0]

    return score


_ENVIRONMENT_OPTIONS = {
    "score": "a Scorer: (task, final answer text) -> reward (default: none, reward 0)",
    "reward": "a RewardFn scoring the final answer (instead of score)",
    "chat_template": "render with the tokenizer's chat template (default: when it has one)",
    "system_prompt": "a system message put first (chat template only)",
    "end_of_turn_ids": "the tokens that end a model turn (default: the tokenizer's EOS)",
    "message_format": "how a tool result is written without a chat template ({role}, {content})",
    "max_calls_per_turn": "tool calls run per turn (default 1)",
    "result_role": "the role of tool-result messages (default 'tool')",
    "result_format": "a tool result's content ({tool}, {status}, {output}; default '{output}')",
    "tool_timeout_s": "seconds a tool call may take before it is given up on (default 120)",
}


def tool_calls_environment(setup: EnvironmentSetup) -> ToolCallEnvironment:
    """``tool_calls``: :class:`~lrft.agents.tool_env.ToolCallEnvironment` with the setup's
    tools; see ``_ENVIRONMENT_OPTIONS`` for its options."""
    options = dict(setup.options)
    unknown = sorted(set(options) - set(_ENVIRONMENT_OPTIONS))
    if unknown:
        known = "; ".join(f"{name}: {help}" for name, help in _ENVIRONMENT_OPTIONS.items())
        raise ConfigError(f"unknown options of the tool_calls environment: {unknown}; {known}")
    score: Scorer | None = options.pop("score", None)
    reward: RewardFn | None = options.pop("reward", None)
    if score is not None and reward is not None:
        raise ConfigError("give the tool_calls environment a score or a reward, not both")
    if reward is not None:
        score = reward_scorer(reward)
    chat = options.pop("chat_template", None)
    use_chat = bool(setup.tokenizer.chat_template) if chat is None else bool(chat)
    end_of_turn_ids = options.pop("end_of_turn_ids", None)
    transcript: Transcript
    if use_chat:
        if "message_format" in options:
            raise ConfigError("message_format applies without a chat template only")
        chat_transcript = ChatTemplateTranscript(
            setup.tokenizer,
            end_of_turn_ids=end_of_turn_ids,
            system_prompt=options.pop("system_prompt", None),
        )
        chat_transcript.check_roles([options.get("result_role", "tool")])
        transcript = chat_transcript
    else:
        if "system_prompt" in options:
            raise ConfigError("system_prompt needs a chat template (chat_template=True)")
        transcript = TextTranscript(
            setup.tokenizer,
            end_of_turn_ids=end_of_turn_ids,
            **(
                {"message_format": options.pop("message_format")}
                if "message_format" in options
                else {}
            ),
        )
    return ToolCallEnvironment(transcript=transcript, tools=setup.tools, score=score, **options)
