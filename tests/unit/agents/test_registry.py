"""Tools and environments by name: built-ins, registrations, entry points, options."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator

import pytest

from lrft.agents import (
    ChatTemplateTranscript,
    EnvironmentSetup,
    TextTranscript,
    ToolCallEnvironment,
    make_environment,
    make_tool,
    register_environment,
    register_tool,
)
from lrft.agents import registry as agents_registry
from lrft.agents.tools import Calculator, PythonTool
from lrft.api import ConfigError, EpisodeStart, EpisodeTask, ModelTurn, StepResult, ToolResult
from lrft.demos.tokenizer import build_tokenizer as build_byte_tokenizer
from lrft.rewards import PerSampleReward
from tests.unit.agents._tokenizer import build_tokenizer


class Echo:
    name = "echo"
    description = "repeats its input"

    def run(self, arguments: str) -> ToolResult:
        return ToolResult(output=arguments)


class Fixed:
    """An environment that asks once and ends."""

    def __init__(self, setup: EnvironmentSetup) -> None:
        self.setup = setup

    def reset(self, task: EpisodeTask) -> EpisodeStart:
        return EpisodeStart(prompt_token_ids=(1,))

    def step(self, turn: ModelTurn) -> StepResult:
        return StepResult(done=True)


@pytest.fixture(autouse=True)
def _forget_registrations() -> Iterator[None]:
    tools, environments = (
        set(agents_registry.tools.names()),
        set(agents_registry.environments.names()),
    )
    yield
    for name in set(agents_registry.tools.names()) - tools:
        agents_registry.tools.remove(name)
    for name in set(agents_registry.environments.names()) - environments:
        agents_registry.environments.remove(name)


def test_built_ins_are_known() -> None:
    assert {"calculator", "python"} <= set(agents_registry.tools.names())
    assert "tool_calls" in agents_registry.environments.names()
    assert isinstance(make_tool("calculator"), Calculator)
    python = make_tool("python", wall_time_s=2.5, isolation="rlimits")
    assert isinstance(python, PythonTool)
    assert python.sandbox.limits.wall_time_s == 2.5
    assert python.sandbox.isolation == "rlimits"


def test_a_tool_option_that_does_not_exist_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"unknown options of the python tool: \['wall_time'\]"):
        make_tool("python", wall_time=2)


def test_registered_factories_are_made_by_name() -> None:
    @register_tool("echo-test")
    def echo() -> Echo:
        return Echo()

    register_environment("fixed-test", Fixed)
    assert make_tool("echo-test").run("hi").output == "hi"
    setup = EnvironmentSetup(tokenizer=build_tokenizer(), tools=[Echo()], options={"k": 1})
    environment = make_environment("fixed-test", setup)
    assert isinstance(environment, Fixed)
    assert environment.setup.options == {"k": 1}


def test_a_taken_name_and_unknown_names_are_refused() -> None:
    with pytest.raises(ConfigError, match="already registered"):
        register_tool("calculator", "somewhere:else")
    with pytest.raises(ConfigError, match=r"unknown tool 'nope'; known: .*calculator"):
        make_tool("nope")
    with pytest.raises(ConfigError, match="must look like"):
        register_environment("bad-target", "no_colon")


def test_a_factory_that_makes_no_tool_is_refused() -> None:
    # a factory that breaks its contract, on purpose
    register_tool("not-a-tool", lambda: object())  # type: ignore[arg-type, return-value]
    with pytest.raises(ConfigError, match="made object, not a Tool"):
        make_tool("not-a-tool")


def test_entry_points_are_discovered(monkeypatch: pytest.MonkeyPatch) -> None:
    point = importlib.metadata.EntryPoint(
        name="third-party-echo", value="tests.unit.agents.test_registry:Echo", group="lrft.tools"
    )
    real = importlib.metadata.entry_points

    def entry_points(*, group: str) -> importlib.metadata.EntryPoints:
        if group == "lrft.tools":
            return importlib.metadata.EntryPoints([point])
        return real(group=group)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    assert "third-party-echo" in agents_registry.tools.names()
    assert isinstance(make_tool("third-party-echo"), Echo)


def test_the_tool_calls_environment_follows_its_options() -> None:
    chat = build_tokenizer()
    env = make_environment("tool_calls", EnvironmentSetup(tokenizer=chat, tools=[Calculator()]))
    assert isinstance(env, ToolCallEnvironment)
    assert isinstance(env.transcript, ChatTemplateTranscript)
    plain = make_environment(
        "tool_calls",
        EnvironmentSetup(
            tokenizer=chat,
            tools=[Calculator()],
            options={"chat_template": False, "message_format": "\n= {content}\n"},
        ),
    )
    assert isinstance(plain, ToolCallEnvironment)
    assert isinstance(plain.transcript, TextTranscript)
    assert plain.transcript.message_format == "\n= {content}\n"
    # the demo tokenizer's template knows user messages only: refused before any episode
    with pytest.raises(ConfigError, match="cannot render a conversation with 'user', 'assistant'"):
        make_environment(
            "tool_calls", EnvironmentSetup(tokenizer=build_byte_tokenizer(), tools=[Calculator()])
        )
    with pytest.raises(
        ConfigError, match=r"unknown options of the tool_calls environment: \['tool'\]"
    ):
        make_environment("tool_calls", EnvironmentSetup(tokenizer=chat, options={"tool": 1}))
    with pytest.raises(ConfigError, match="system_prompt needs a chat template"):
        make_environment(
            "tool_calls",
            EnvironmentSetup(
                tokenizer=chat, options={"chat_template": False, "system_prompt": "s"}
            ),
        )


def test_the_tool_calls_environment_scores_with_a_reward_function() -> None:
    tokenizer = build_byte_tokenizer()
    reward = PerSampleReward(name="exact", score=lambda s: float(s.response == s.reference))
    setup = EnvironmentSetup(
        tokenizer=tokenizer,
        tools=[Calculator()],
        options={"chat_template": False, "reward": reward},
    )
    env = make_environment("tool_calls", setup)
    env.reset(EpisodeTask(prompt="2+2=", reference="4"))
    answer = [*tokenizer.encode("4"), tokenizer.eos_token_id]
    step = env.step(ModelTurn(index=0, token_ids=answer, finish_reason="stop"))
    assert step.done
    assert step.reward == 1.0
