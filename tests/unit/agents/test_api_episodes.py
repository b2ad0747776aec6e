"""The multi-turn value types of ``lrft.api`` refuse bad values where they are made."""

from __future__ import annotations

import math

import pytest

from lrft.agents import TextTranscript, ToolCallEnvironment
from lrft.agents.tools import Calculator, PythonTool
from lrft.api import (
    ChatMessage,
    ConfigError,
    Environment,
    EpisodeBudget,
    EpisodeStart,
    EpisodeTask,
    ModelTurn,
    StepResult,
    Tool,
    ToolResult,
)
from lrft.demos.tokenizer import build_tokenizer


def test_a_step_that_ends_the_episode_takes_no_observation() -> None:
    with pytest.raises(ConfigError, match="takes no observation, got 2 observation tokens"):
        StepResult(done=True, observation_token_ids=(1, 2))
    assert StepResult(done=True).observation_token_ids == ()


@pytest.mark.parametrize("reward", [math.nan, math.inf])
def test_a_step_reward_must_be_finite(reward: float) -> None:
    with pytest.raises(ConfigError, match="reward must be finite"):
        StepResult(reward=reward)


def test_token_ids_are_checked() -> None:
    with pytest.raises(ConfigError, match="non-negative integers"):
        StepResult(observation_token_ids=(1, -1))
    with pytest.raises(ConfigError, match="must not be empty"):
        EpisodeStart(prompt_token_ids=())
    with pytest.raises(ConfigError, match="non-negative integers"):
        ModelTurn(index=0, token_ids=(-3,), finish_reason="stop")


@pytest.mark.parametrize(
    "fields",
    [
        {"max_turns": 0, "max_total_tokens": 10},
        {"max_turns": 1, "max_total_tokens": 0},
        {"max_turns": 1, "max_total_tokens": 10, "max_turn_tokens": 0},
        {"max_turns": 1.5, "max_total_tokens": 10},
    ],
)
def test_budgets_are_positive_integers(fields: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match="must be a positive integer"):
        EpisodeBudget(**fields)  # type: ignore[arg-type]


def test_a_task_prompt_is_text_or_a_conversation() -> None:
    task = EpisodeTask(prompt=[{"role": "user", "content": "hi"}], metadata={"k": 1})
    assert task.prompt == (ChatMessage(role="user", content="hi"),)
    assert task.metadata["k"] == 1
    with pytest.raises(TypeError):
        task.metadata["k"] = 2  # type: ignore[index]
    with pytest.raises(ConfigError, match="empty conversation"):
        EpisodeTask(prompt=[])
    with pytest.raises(ConfigError, match="message 1 of an episode task's prompt must have"):
        EpisodeTask(prompt=[{"role": "user", "content": "hi"}, {"text": "no role"}])
    with pytest.raises(ConfigError, match="non-empty word"):
        ChatMessage(role=" user", content="x")


def test_the_built_ins_satisfy_the_protocols() -> None:
    tokenizer = build_tokenizer()
    environment = ToolCallEnvironment(transcript=TextTranscript(tokenizer), tools=[Calculator()])
    assert isinstance(environment, Environment)
    assert isinstance(Calculator(), Tool)
    assert isinstance(PythonTool(isolation="rlimits"), Tool)
    assert ToolResult(output="x").ok
    assert not ToolResult(output="x", status="wall_time_limit").ok
