"""``lrft train --help`` lists every flag once, under the group its Flag declares, with the
default the config really takes (and the demo's where it differs); negative numbers reach the
config validator, which refuses nonsense in one line naming the value and the rule."""

from __future__ import annotations

import re

import pytest

from lrft.cli import config_from_args, main
from lrft.cli.flags import FLAGS, Flag, FlagGroup
from lrft.config import TrainConfig
from lrft.extras import tensorboard_available
from tests.unit.trainer.config_errors import config_problems

MODEL = ["train", "--pretrain=m", "--prompt_data=p.jsonl", "--reward_fn=math"]
MODEL_FLAGS = {"pretrain", "prompt_data", "reward_fn"}
SHOWN = re.compile(r"\[(default: [^\]]*)\]$")


def _help(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", "4000")  # one line per flag: nothing wraps
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def _sections(text: str) -> dict[str, dict[str, str]]:
    """Section title -> flag name -> that flag's entry (its help joined onto one line)."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    name = ""
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            current, name = sections.setdefault(line[:-1], {}), ""
            continue
        match = re.match(r"^  --(\w+)", line)
        if match:
            name = match.group(1)
            assert name not in current, f"--{name} listed twice in one section"
            current[name] = line.strip()
        elif name and line.startswith("   "):  # the help, when argparse puts it below
            current[name] += " " + line.strip()
        else:
            name = ""
    return sections


def test_every_flag_is_listed_once_under_its_own_group(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sections = _sections(_help(capsys, monkeypatch))
    titles = [group.value for group in FlagGroup]
    assert [title for title in sections if title != "options"] == titles
    for flag in FLAGS:
        holders = [title for title, lines in sections.items() if flag.name in lines]
        assert holders == [flag.group.value], (flag.name, holders)
    assert all(sections[title] for title in titles), "an empty group"
    assert set(sections["options"]) == {"config"}  # and -h, --help


def test_a_flag_cannot_be_declared_without_a_group() -> None:
    with pytest.raises(TypeError, match="group"):
        Flag(name="overwrite", kind=bool, help="h")  # type: ignore[call-arg]  # the point


def _value(text: str, flag: Flag) -> object:
    """What a shown default means, read back without lrft's own formatting code."""
    if text in ("on", "off"):
        return text == "on"
    if text == "unset":
        return None
    if text == "none":
        return ()
    if flag.nargs is not None:  # several values, shown as they are typed: space-separated
        return tuple(flag.kind(item) for item in text.split(" "))
    return flag.kind(text)


def test_each_shown_default_is_what_the_config_takes_without_the_flag(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = {
        name: line
        for s in _sections(_help(capsys, monkeypatch)).values()
        for name, line in s.items()
    }
    configs = {
        "model": config_from_args(MODEL),
        "demo": config_from_args(["train"]),
        "demo with gae": config_from_args(["train", "--advantage_estimator=gae"]),
    }
    for flag in FLAGS:
        match = SHOWN.search(lines[flag.name])
        assert match, f"--{flag.name} shows no default: {lines[flag.name]!r}"
        parts = dict(part.split(": ", 1) for part in match.group(1).split("; "))
        if flag.computed_default is not None:
            assert parts == {"default": flag.computed_default}
            continue
        plain = configs["demo" if flag.name in MODEL_FLAGS else "model"]
        assert _value(parts["default"], flag) == getattr(plain, flag.name), flag.name
        demo = parts.get("demo", parts["default"])
        assert _value(demo, flag) == getattr(configs["demo"], flag.name), (flag.name, parts)
        if flag.group is FlagGroup.CRITIC:  # what the demo trains its critic with
            gae = parts.get("demo with gae", demo)
            assert _value(gae, flag) == getattr(configs["demo with gae"], flag.name), flag.name
    # the one computed default, against both configs
    assert configs["model"].use_tensorboard is False
    assert configs["demo"].use_tensorboard is tensorboard_available()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--actor_learning_rate", "-1e-4"], "actor_learning_rate must be > 0, got -0.0001"),
        (
            ["--advantage_estimator=gae", "--critic_learning_rate", "-1E-5"],
            "critic_learning_rate must be > 0, got -1e-05",
        ),
        (["--eps_clip", "-0.2"], "eps_clip must be > 0, got -0.2"),
        (["--eps_clip_low_high", "-1e-3", "0.2"], "eps_clip_low_high (-0.001, 0.2): LOW must be"),
        (
            ["--advantage_estimator=gae", "--value_clip", "-1e-2"],
            "value_clip must be >= 0, got -0.01",
        ),
        (["--temperature", "-1e-1"], "temperature must be > 0, got -0.1"),
        (["--train_batch_size", "-128"], "train_batch_size must be a positive integer, got -128"),
        (["--micro_rollout_batch_size", "0"], "micro_rollout_batch_size must be a positive"),
        (["--max_samples", "-3"], "max_samples must be a positive integer, got -3"),
        (["--eval_max_samples", "0"], "eval_max_samples must be a positive integer, got 0"),
        (["--prompt_max_len", "0"], "prompt_max_len must be a positive integer, got 0"),
        (["--save_steps", "0"], "save_steps must be a positive number of iterations or -1, got 0"),
        (["--eval_steps", "-2"], "eval_steps must be a positive number of iterations or -1"),
        (["--collective_timeout_s", "-5e0"], "collective_timeout_s must be > 0, got -5.0"),
    ],
)
def test_a_negative_or_zero_value_is_refused_by_the_config_in_one_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*MODEL, *argv]) == 2
    err = capsys.readouterr().err
    assert any(message in problem for problem in config_problems(err)), err


def test_negative_numbers_that_make_sense_parse_as_values() -> None:
    config = config_from_args(
        [*MODEL, "--seed", "-3", "--reward_pretrain=rm", "--reward_weights", "-1,2.5e-1"]
    )
    assert (config.seed, config.reward_weights) == (-3, (-1.0, 0.25))
    assert config_from_args([*MODEL, "--save_steps", "-1"]).save_steps == -1
    assert isinstance(config, TrainConfig)
