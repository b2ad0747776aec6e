"""The reward flags' validation: lists, URLs, weights per reward, settings that need another flag,
and the reward-model folders checked before any process group starts."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from lrft import extras
from lrft.api.errors import ConfigError
from lrft.cli import config_from_args
from lrft.config import TrainConfig
from lrft.trainer.rewards import check_reward_settings

BASE = ["train", "--pretrain=m", "--prompt_data=p.jsonl"]


def test_lists_read_commas_or_lists_and_count_the_rewards() -> None:
    config = config_from_args(
        [*BASE, "--reward_fn=math", "--reward_pretrain=a, b", "--remote_rm_url=http://h:1/x"]
    )
    assert config.reward_pretrain == ("a", "b")
    assert config.remote_rm_url == ("http://h:1/x",)
    assert config.reward_count == 4
    # a config file (or the API) may give lists
    same = TrainConfig(pretrain="m", prompt_data="p", reward_pretrain=["a", "b"])
    assert same.reward_pretrain == ("a", "b")
    assert same.reward_count == 2
    weights = config_from_args([*BASE, "--reward_pretrain=a,b", "--reward_weights=1,-0.5"])
    assert weights.reward_weights == (1.0, -0.5)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            [],
            r"pretrain needs a reward: reward_fn .*, reward_pretrain, grm_pretrain or remote_rm_url",
        ),
        (["--reward_pretrain=a,,b"], r"reward_pretrain 'a,,b' has an empty entry"),
        (["--remote_rm_url=localhost:8000"], r"entry 'localhost:8000' must be an http"),
        (["--reward_fn=math", "--reward_weights=1,2"], r"2 entries for 1 rewards"),
        (["--reward_fn=math", "--reward_weights=1,x"], r"reward_weights '1,x' must be numbers"),
        (["--reward_fn=math", "--reward_weights=inf"], r"must be one or more finite numbers"),
        (["--reward_fn=math", "--remote_rm_timeout_s=3"], r"remote_rm_timeout_s applies to"),
        (["--reward_fn=math", "--remote_rm_max_attempts=1"], r"max_attempts applies to remote"),
        (["--remote_rm_url=http://h/x", "--remote_rm_timeout_s=0"], r"timeout_s must be > 0"),
    ],
)
def test_invalid_reward_settings_are_named(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_args([*BASE, *argv])


def test_the_demo_refuses_a_reward_it_would_ignore() -> None:
    with pytest.raises(ConfigError, match=r"the built-in demo brings its own reward"):
        config_from_args(["train", "--reward_pretrain=rm"])


def _folder(root: Path, labels: int | None) -> Path:
    root.mkdir()
    config: dict[str, Any] = {"model_type": "qwen2"}
    if labels is not None:
        config["id2label"] = {str(i): f"LABEL_{i}" for i in range(labels)}
    (root / "config.json").write_text(json.dumps(config))
    return root


def test_reward_model_folders_are_checked_before_any_process_group(tmp_path: Path) -> None:
    good = _folder(tmp_path / "good", labels=1)
    check_reward_settings(TrainConfig(pretrain="m", prompt_data="p", reward_pretrain=[str(good)]))
    two = _folder(tmp_path / "two", labels=2)
    bare = _folder(tmp_path / "bare", labels=None)  # transformers' default is two labels
    for folder, message in (
        (tmp_path / "nothing", r"'.*nothing' is not a model folder \(no config.json\)"),
        (two, r"'.*two' has 2 labels; a reward model has one"),
        (bare, r"'.*bare' has 2 labels"),
    ):
        config = TrainConfig(pretrain="m", prompt_data="p", reward_pretrain=[str(folder)])
        with pytest.raises(ConfigError, match=message):
            check_reward_settings(config)


def test_a_reward_service_without_httpx_is_refused_with_the_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a, **k: None if name == "httpx" else real(name, *a, **k),
    )
    with pytest.raises(
        ConfigError, match=r"^remote_rm_url needs the httpx package, which is not installed: pip"
    ):
        TrainConfig(pretrain="m", prompt_data="p", remote_rm_url="http://127.0.0.1:9/x")


def test_the_math_reward_without_math_verify_is_refused_with_the_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings: dict[str, Any] = {"pretrain": "m", "prompt_data": "p", "reference_key": "answer"}
    monkeypatch.setattr(extras, "math_verify_available", lambda: True)
    TrainConfig(**settings, reward_fn="math")
    monkeypatch.setattr(extras, "math_verify_available", lambda: False)
    with pytest.raises(ConfigError) as raised:
        TrainConfig(**settings, reward_fn="math")
    assert str(raised.value) == (
        "--reward_fn math needs the math-verify package, which is not installed: "
        "pip install 'lrft[rewards]'"
    )
    # a reward of the user's own needs no verifier
    TrainConfig(**settings, reward_fn="lrft.demos:exact_answer")


def test_the_math_verify_probe_asks_the_import_system(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    assert extras.math_verify_available() is (real("math_verify") is not None)
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a, **k: None if name == "math_verify" else real(name, *a, **k),
    )
    assert extras.math_verify_available() is False
