"""The shipped environment check: the built-in environment passes it, broken ones do not."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import attrs
import pytest
from transformers import PreTrainedTokenizerFast

from lrft.agents import EnvironmentSetup, make_environment
from lrft.agents.sandbox import SandboxLimits
from lrft.agents.tools import Calculator, PythonTool
from lrft.api import EpisodeError, EpisodeStart, EpisodeTask, ModelTurn, StepResult
from lrft.demos.tokenizer import build_tokenizer as build_byte_tokenizer
from lrft.testing.environments import EnvironmentCheckError, check_environment
from tests.unit.agents._tokenizer import build_tokenizer

TASKS = [
    EpisodeTask(prompt="What is 12 * 3?", reference="36", task_id="a"),
    EpisodeTask(prompt="What is 7 + 5?", reference="12", task_id="b"),
]
CALLS = {"a": "<calculator>12*3</calculator>", "b": "<calculator>7+5</calculator>"}


def _script(tokenizer: PreTrainedTokenizerFast, first: dict[str, str]):  # type: ignore[no-untyped-def]
    def turn(task: EpisodeTask, index: int, context: Sequence[int]) -> list[int]:
        text = first[task.task_id] if index == 0 else f"The answer is {task.reference}."
        return [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]

    return turn


def _exact(task: EpisodeTask, answer: str) -> float:
    return float(task.reference is not None and task.reference in answer)


def test_the_tool_calls_environment_with_a_chat_template_passes() -> None:
    tokenizer = build_tokenizer()
    setup = EnvironmentSetup(
        tokenizer=tokenizer, tools=[Calculator()], options={"score": _exact, "system_prompt": "s"}
    )
    report = check_environment(
        lambda: make_environment("tool_calls", setup),
        TASKS,
        script=_script(tokenizer, CALLS),
        vocab_size=len(tokenizer),
        stop_token_ids=[tokenizer.eos_token_id],
    )
    assert [e.end for e in report.scripted] == ["done", "done"]
    assert [e.reward for e in report.scripted] == [1.0, 1.0]
    observation = report.scripted[0].response_token_ids[
        report.scripted[0].turns[0].length : report.scripted[0].turns[1].start
    ]
    assert "<tool_response>\n36\n</tool_response>" in tokenizer.decode(list(observation))


def test_the_tool_calls_environment_with_the_python_tool_passes() -> None:
    tokenizer = build_byte_tokenizer()
    python = PythonTool(SandboxLimits(wall_time_s=5.0))
    setup = EnvironmentSetup(
        tokenizer=tokenizer,
        tools=[python],
        options={"score": _exact, "chat_template": False, "message_format": "\n{content}\n"},
    )
    calls = {"a": "<python>print(12 * 3)</python>", "b": "<python>print(7 + 5)</python>"}
    report = check_environment(
        lambda: make_environment("tool_calls", setup),
        TASKS,
        script=_script(tokenizer, calls),
        vocab_size=len(tokenizer),
        stop_token_ids=[tokenizer.eos_token_id],
        random_episodes=2,
    )
    first = report.scripted[0]
    observation = first.response_token_ids[first.turns[0].length : first.turns[1].start]
    assert tokenizer.decode(list(observation)) == "\n36\n"
    assert first.reward == 1.0


_COUNTER = itertools.count()


@attrs.define
class Scripted:
    """A small correct environment that a fault switches on one at a time breaks."""

    fault: str = ""
    resets: int = 0
    turn: int | None = None

    def reset(self, task: EpisodeTask) -> EpisodeStart:
        self.resets += 1
        self.turn = 0
        extra = (self.resets,) if self.fault == "random_reset" else ()
        return EpisodeStart(prompt_token_ids=(1, 2, *extra))

    def step(self, turn: ModelTurn) -> StepResult:
        if self.resets == 0:
            raise EpisodeError("step before reset")
        if self.turn is None and self.fault != "steps_after_done":
            raise EpisodeError("step after the episode ended")
        if self.fault == "raises_on_odd_tokens" and any(t % 2 for t in turn.token_ids):
            raise ValueError("odd token")
        done = turn.index >= 1
        self.turn = None if done else (self.turn or 0) + 1
        reward = float(next(_COUNTER)) if self.fault == "changing_rewards" else 0.0
        observation = (300,) if self.fault == "outside_vocabulary" else (4,)
        return StepResult(
            done=done, reward=reward, observation_token_ids=() if done else observation
        )


def test_a_correct_environment_passes() -> None:
    check_environment(Scripted, TASKS, vocab_size=10, script=lambda t, i, c: [5, 6])


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("random_reset", "a second reset gave another prompt"),
        ("changing_rewards", "the same turns gave another episode"),
        ("raises_on_odd_tokens", "raised ValueError: odd token"),
        ("outside_vocabulary", "outside the vocabulary"),
        ("steps_after_done", "step after the episode was done did not raise"),
    ],
)
def test_a_broken_environment_fails_with_the_rule_it_broke(fault: str, message: str) -> None:
    with pytest.raises(EnvironmentCheckError, match=message):
        check_environment(
            lambda: Scripted(fault=fault), TASKS, vocab_size=10, script=lambda t, i, c: [5, 6]
        )
