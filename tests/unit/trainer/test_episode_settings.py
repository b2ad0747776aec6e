"""The multi-turn settings: refused with the value and the rule before any process group starts,
and what each one sets."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from lrft.agents import register_tool
from lrft.agents.registry import tools as tool_registry
from lrft.agents.tools import Calculator
from lrft.api.episodes import EpisodeBudget
from lrft.api.errors import ConfigError
from lrft.cli import config_from_args, main
from lrft.config import TrainConfig
from lrft.demos.apply import apply_demo_or_preset
from lrft.dist import RankInfo
from lrft.trainer.build import build_trainer

MODEL = ["train", "--pretrain=m", "--prompt_data=p.jsonl", "--reward_fn=math"]
EPISODES = [*MODEL, "--environment=tool_calls"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            [*MODEL, "--environment=chess"],
            r"environment 'chess' is unknown; choose one of \['tool_calls'\], or give a factory",
        ),
        (
            [*EPISODES, "--tools", "calculator", "browser"],
            r"tools: 'browser' is unknown; choose among \['calculator', 'python'\]",
        ),
        ([*EPISODES, "--tools=calculator,calculator"], "tools names a tool twice"),
        ([*MODEL, "--tools=calculator"], r"tools \('calculator',\) needs an environment"),
        ([*MODEL, "--max_turns=3"], "max_turns 3 needs an environment"),
        ([*MODEL, "--max_episode_tokens=64"], "max_episode_tokens 64 needs an environment"),
        ([*MODEL, "--environment_options={}"], "environment_options '{}' needs an environment"),
        ([*EPISODES, "--environment_options={oops"], "environment_options is not valid JSON"),
        ([*EPISODES, "--environment_options=[1]"], "environment_options must be a JSON object"),
        ([*EPISODES, "--dynamic_sampling"], "dynamic_sampling does not apply to multi-turn"),
        ([*EPISODES, "--normalize_reward"], "normalize_reward does not apply to multi-turn"),
        ([*EPISODES, "--apply_chat_template"], "apply_chat_template does not apply"),
        (
            [*EPISODES, "--max_episode_tokens=32", "--prompt_max_len=32"],
            "prompt_max_len 32 leaves no room for a model turn in max_episode_tokens 32",
        ),
    ],
)
def test_bad_settings_are_refused_before_starting(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_args(argv)
    assert main(argv) == 2
    assert not dist.is_initialized()
    capsys.readouterr()


def test_the_flags_set_the_episode_budget_and_the_options() -> None:
    config = config_from_args(
        [
            *EPISODES,
            "--tools",
            "calculator",
            "python",
            "--max_turns=3",
            "--max_episode_tokens=200",
            "--generate_max_len=16",
            '--environment_options={"chat_template": false, "max_calls_per_turn": 2}',
        ]
    )
    assert config.tools == ("calculator", "python")
    assert config.episode_budget() == EpisodeBudget(
        max_turns=3, max_total_tokens=200, max_turn_tokens=16
    )
    assert config.environment_option_values() == {"chat_template": False, "max_calls_per_turn": 2}
    defaults = config_from_args(EPISODES)
    assert defaults.episode_budget() == EpisodeBudget(
        max_turns=4, max_total_tokens=1024, max_turn_tokens=defaults.generate_max_len
    )
    assert config_from_args(MODEL).episode_budget() is None


def test_a_tool_registered_under_its_name_is_accepted() -> None:
    register_tool("sums", lambda: Calculator())
    try:
        assert TrainConfig(environment="tool_calls", tools=["sums"]).tools == ("sums",)
    finally:
        tool_registry.remove("sums")


def _rank() -> RankInfo:
    return RankInfo(
        rank=0, local_rank=0, world_size=1, local_world_size=1, device=torch.device("cpu")
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ('{"chat_template": false, "bogus": 1}', r"unknown options of the tool_calls .*'bogus'"),
        # the demo tokenizer's template renders user messages only, not tool results
        (None, "the demo model knows only user messages"),
    ],
)
def test_an_environment_that_cannot_be_made_is_refused_before_the_process_group(
    tmp_path: Path, options: str | None, message: str
) -> None:
    config = TrainConfig(
        environment="tool_calls",
        tools=["calculator"],
        environment_options=options,
        save_path=str(tmp_path),
    )
    with pytest.raises(ConfigError, match=message):
        # as lrft train does: the demo's model and prompts first
        build_trainer(apply_demo_or_preset(config, rank=0), _rank())
    assert not dist.is_initialized()


@pytest.mark.parametrize("flag", ["--images_key=images", "--audios_key=audio"])
def test_media_prompts_are_refused_with_an_environment(flag: str) -> None:
    name = flag.split("=")[0].lstrip("-")
    with pytest.raises(ConfigError, match=rf"{name} does not apply to multi-turn episodes"):
        config_from_args([*EPISODES, flag])
