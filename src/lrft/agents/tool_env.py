"""The built-in tool-using environment: the model calls tools until it answers.

Each model turn is read for tool calls (:class:`TagCallFormat` by default: ``<python>code
</python>``, ``<calculator>2**64</calculator>``). A turn with calls gets their results back as
messages (role ``tool`` by default) rendered by the episode's :class:`~lrft.agents.chat.Transcript`;
a turn without one is the answer: the episode is done and ``score(task, answer)`` is its reward
(no score: reward 0, for a trainer that scores episodes with its own reward function).

Nothing the model writes raises here: an unknown tool, too many calls, a failing or hanging tool,
a turn the chat template cannot render. Each becomes an observation or, for the template, the end
of the episode, and is counted in the step's metrics (``tool_calls``, ``tool_failures``,
``template_mismatch``).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import Protocol

import attrs

from lrft.agents.chat import TemplateMismatchError, Transcript
from lrft.api.episodes import ChatMessage, EpisodeStart, EpisodeTask, ModelTurn, StepResult
from lrft.api.errors import ConfigError, EpisodeError
from lrft.api.tools import Tool, ToolResult

logger = logging.getLogger(__name__)

Scorer = Callable[[EpisodeTask, str], float]
"""The reward of an episode from its task and the text of the model's final answer."""


@attrs.frozen(kw_only=True)
class ToolCall:
    tool: str
    arguments: str


class ToolCallFormat(Protocol):
    """Finds the tool calls in a model turn's text, in the order they were written."""

    def parse(self, text: str, tools: Collection[str]) -> list[ToolCall]: ...


@attrs.frozen(kw_only=True)
class TagCallFormat:
    """``<name>arguments</name>`` for each tool name; an unclosed tag is not a call."""

    def parse(self, text: str, tools: Collection[str]) -> list[ToolCall]:
        calls: list[tuple[int, ToolCall]] = []
        for name in tools:
            pattern = re.compile(rf"<{re.escape(name)}>(.*?)</{re.escape(name)}>", re.DOTALL)
            for match in pattern.finditer(text):
                calls.append((match.start(), ToolCall(tool=name, arguments=match.group(1))))
        return [call for _, call in sorted(calls, key=lambda item: item[0])]


def _run_tool(tool: Tool, arguments: str) -> ToolResult:
    start = time.monotonic()
    try:
        return tool.run(arguments)
    except Exception as error:  # a tool that breaks its contract must not end the caller
        logger.warning("tool %r raised %s: %s", tool.name, type(error).__name__, error)
        return ToolResult(
            output=f"the tool failed: {type(error).__name__}: {error}",
            status="sandbox_error",
            seconds=time.monotonic() - start,
        )


def _run_tool_within(tool: Tool, arguments: str, timeout_s: float | None) -> ToolResult:
    """:func:`_run_tool`, given up on after ``timeout_s``: a tool that breaks its promise to
    return within its own deadline must not stall every rank's rollout. A thread cannot be
    killed, so a hung call is left running in a daemon thread (it ends with the process)."""
    if timeout_s is None:
        return _run_tool(tool, arguments)
    answer: list[ToolResult] = []
    worker = threading.Thread(
        target=lambda: answer.append(_run_tool(tool, arguments)),
        name=f"lrft-tool-{tool.name}",
        daemon=True,
    )
    worker.start()
    worker.join(timeout_s)
    if answer:
        return answer[0]
    logger.warning("tool %r did not answer within %g s; leaving it behind", tool.name, timeout_s)
    return ToolResult(
        output=f"[stopped: the tool did not answer within {timeout_s:g} s]",
        status="wall_time_limit",
        seconds=timeout_s,
    )


class ToolCallEnvironment:
    """Tool calls until an answer; see the module docstring. One instance per episode.

    ``result_format`` renders one call's result as a message's content, with the fields
    ``{tool}``, ``{status}`` and ``{output}``. ``max_calls_per_turn`` calls of a turn run; the
    rest are answered with a note. ``tool_timeout_s`` bounds each call, whatever the tool's own
    limits (``None``: wait as long as the tool takes).
    """

    def __init__(
        self,
        *,
        transcript: Transcript,
        tools: Sequence[Tool],
        score: Scorer | None = None,
        call_format: ToolCallFormat | None = None,
        max_calls_per_turn: int = 1,
        result_role: str = "tool",
        result_format: str = "{output}",
        tool_timeout_s: float | None = 120.0,
    ) -> None:
        names = [tool.name for tool in tools]
        if len(set(names)) != len(names):
            raise ConfigError(f"tool names must be distinct, got {names}")
        if tool_timeout_s is not None and not tool_timeout_s > 0:
            raise ConfigError(f"tool_timeout_s must be > 0 or None, got {tool_timeout_s!r}")
        if max_calls_per_turn < 1:
            raise ConfigError(f"max_calls_per_turn must be >= 1, got {max_calls_per_turn}")
        try:
            result_format.format(tool="", status="", output="")
        except (KeyError, IndexError, ValueError) as error:
            raise ConfigError(
                f"result_format {result_format!r} may use only {{tool}}, {{status}} and "
                f"{{output}} ({error})"
            ) from error
        self.transcript = transcript
        self.tools = {tool.name: tool for tool in tools}
        self.score = score
        self.call_format = call_format if call_format is not None else TagCallFormat()
        self.max_calls_per_turn = max_calls_per_turn
        self.result_role = result_role
        self.result_format = result_format
        self.tool_timeout_s = tool_timeout_s
        self._task: EpisodeTask | None = None
        self._next_turn = 0

    def reset(self, task: EpisodeTask) -> EpisodeStart:
        self._task = task
        self._next_turn = 0
        return EpisodeStart(prompt_token_ids=self.transcript.start(task))

    def step(self, turn: ModelTurn) -> StepResult:
        task = self._task
        if task is None:
            raise EpisodeError("step before reset, or after the episode ended")
        if turn.index != self._next_turn:
            raise EpisodeError(f"expected turn {self._next_turn}, got turn {turn.index}")
        self._next_turn += 1
        text = self.transcript.model_turn(turn.token_ids)
        calls = self.call_format.parse(text, self.tools)
        if not calls:
            self._task = None
            reward = 0.0 if self.score is None else float(self.score(task, text))
            return StepResult(reward=reward, done=True, metrics={"tool_calls": 0.0})
        results = [self._answer(call) for call in calls[: self.max_calls_per_turn]]
        messages = [
            ChatMessage(
                role=self.result_role,
                content=self.result_format.format(
                    tool=call.tool, status=result.status, output=result.output
                ),
            )
            for call, result in zip(calls, results, strict=False)
        ]
        skipped = len(calls) - len(results)
        if skipped:
            messages[-1] = attrs.evolve(
                messages[-1],
                content=f"{messages[-1].content}\n[{skipped} more calls were not run: at most "
                f"{self.max_calls_per_turn} per turn]",
            )
        metrics = {
            "tool_calls": float(len(results)),
            "tool_failures": float(sum(not r.ok for r in results)),
            "tool_seconds": sum(r.seconds for r in results),
        }
        try:
            observation = self.transcript.observe(messages)
        except TemplateMismatchError as error:
            logger.warning("ending an episode of task %r: %s", task.task_id, error)
            self._task = None
            return StepResult(done=True, metrics={**metrics, "template_mismatch": 1.0})
        return StepResult(observation_token_ids=observation, metrics=metrics)

    def _answer(self, call: ToolCall) -> ToolResult:
        tool = self.tools.get(call.tool)
        if tool is None:  # a custom call format may find names that are not tools
            known = ", ".join(self.tools)
            return ToolResult(
                output=f"unknown tool {call.tool!r}; tools: {known}", status="invalid_input"
            )
        return _run_tool_within(tool, call.arguments, self.tool_timeout_s)
