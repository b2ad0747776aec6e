"""Config validation (before any process group) and the command line: every flag has an effect."""

from __future__ import annotations

import json
import re
from pathlib import Path

import attrs
import pytest

from lrft.api.errors import ConfigError
from lrft.cli import config_from_args, main
from lrft.cli.flags import FLAGS
from lrft.trainer.config import TrainConfig
from lrft.trainer.demo import DEMO_SETTINGS
from lrft.trainer.metrics import tensorboard_available

MODEL = ["train", "--pretrain=m", "--prompt_data=p.jsonl", "--reward_fn=math"]


def test_rollout_samples_must_be_a_multiple_of_train_batch() -> None:
    with pytest.raises(ConfigError, match=r"train_batch_size 48 must divide .* 32 \* 8 = 256"):
        TrainConfig(train_batch_size=48)


@pytest.mark.parametrize(
    ("world", "changes", "message"),
    [
        (3, {"engine_tp_size": 1}, r"rollout_batch_size 32 is not divisible by world size 3"),
        (2, {"micro_train_batch_size": 48}, r"train_batch_size 128 must equal world size 2"),
    ],
)
def test_world_rules_name_value_and_rule(world: int, changes: dict[str, int], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**changes).validate_world(world)  # type: ignore[arg-type]


def test_engine_tp_size_beyond_the_engine_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"engine_tp_size 2 exceeds engine 'hf'"):
        TrainConfig(engine_tp_size=2)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"advantage_estimator": "gae"}, r"'gae' is not supported .* critic"),
        ({"n_samples_per_prompt": 1, "train_batch_size": 32}, r"n_samples_per_prompt must be >= 2"),
        ({"use_kl_loss": True}, r"use_kl_loss needs init_kl_coef > 0"),
        ({"adam_offload": True, "fsdp_cpu_offload": True}, r"choose one"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\], got 0.0"),
        ({"rollout_batch_size": 0}, r"rollout_batch_size must be a positive integer, got 0"),
        ({"pretrain": "m"}, r"pretrain needs prompt_data"),
        ({"kl_estimator": "k9"}, r"kl_estimator 'k9' is unknown"),
        ({"zero_stage": 4}, r"zero_stage must be 1, 2 or 3 .*got 4"),
        ({"zero_stage": 3, "fsdp_cpu_offload": True}, r"fsdp_cpu_offload is an FSDP2 setting"),
        ({"deepspeed_config": "ds.json"}, r"deepspeed_config 'ds.json' needs zero_stage"),
    ],
)
def test_invalid_values_are_named(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**changes)  # type: ignore[arg-type]


def test_cli_reports_config_errors_before_starting(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*MODEL, "--train_batch_size=48"]) == 2
    assert "train_batch_size 48 must divide" in capsys.readouterr().err


def test_world_size_comes_from_torchrun_env(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert main(MODEL) == 2
    assert "not divisible by world size 3" in capsys.readouterr().err


def test_config_file_and_command_line(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(
        json.dumps({"pretrain": "m", "prompt_data": "p", "reward_fn": "math", "seed": 5, "l2": 0.1})
    )
    config = config_from_args(["train", f"--config={path}", "--seed=7"])
    assert (config.seed, config.l2, config.pretrain) == (7, 0.1, "m")
    yaml_path = tmp_path / "c.yaml"
    yaml_path.write_text("pretrain: m\nprompt_data: p\nreward_fn: math\nbogus: 1\n")
    with pytest.raises(ConfigError, match=r"unknown keys \['bogus'\]"):
        config_from_args(["train", f"--config={yaml_path}"])


def test_no_model_means_the_demo_preset() -> None:
    config = config_from_args(["train"])
    assert config.pretrain is None
    for name, value in DEMO_SETTINGS.items():
        assert getattr(config, name) == value
    assert config_from_args(["train", "--max_steps=3"]).max_steps == 3


def test_tensorboard_missing_is_refused_before_starting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("lrft.trainer.config.tensorboard_available", lambda: False)
    with pytest.raises(ConfigError, match=r"use_tensorboard .* pip install 'lrft\[plots\]'"):
        TrainConfig(use_tensorboard=True)
    assert main([*MODEL, "--use_tensorboard"]) == 2
    assert "pip install 'lrft[plots]'" in capsys.readouterr().err
    assert config_from_args(["train"]).use_tensorboard is False  # the demo runs without it


def test_tensorboard_is_on_for_the_demo_when_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("lrft.trainer.config.tensorboard_available", lambda: True)
    assert config_from_args(["train"]).use_tensorboard is True
    assert config_from_args(["train", "--no-use_tensorboard"]).use_tensorboard is False
    assert config_from_args(MODEL).use_tensorboard is False
    assert config_from_args([*MODEL, "--use_tensorboard"]).use_tensorboard is True


def _non_default(name: str) -> list[str]:
    """A command line that sets ``name`` to something other than its default (still valid)."""
    special = {
        "use_kl_loss": ["--use_kl_loss", "--init_kl_coef=0.1"],
        "engine_type": [],  # one engine: covered by test_engine_type_has_one_choice
        "kl_estimator": ["--kl_estimator=k1"],
        "advantage_estimator": ["--advantage_estimator=rloo"],
        "train_batch_size": ["--train_batch_size=64"],
        "micro_train_batch_size": ["--micro_train_batch_size=8"],
        "rollout_batch_size": ["--rollout_batch_size=16"],
        "n_samples_per_prompt": ["--n_samples_per_prompt=4"],
        "top_p": ["--top_p=0.5"],
        "reward_fn": ["--reward_fn=a:b"],
        "max_steps": ["--max_steps=2"],
        "engine_tp_size": [],  # hf supports only 1: covered by the validation test
        "save_hf_model": ["--no-save_hf_model"],
        "zero_stage": ["--zero_stage=3"],
        "deepspeed_config": ["--zero_stage=3", "--deepspeed_config=ds.json"],
        # the default depends on the preset; without tensorboard the flag is an error (tested)
        "use_tensorboard": ["--use_tensorboard"] if tensorboard_available() else [],
    }
    if name in special:
        return special[name]
    flag = next(f for f in FLAGS if f.name == name)
    default = attrs.fields_dict(TrainConfig)[name].default
    if flag.kind is bool:
        return [f"--{name}" if not default else f"--no-{name}"]
    if flag.kind is int:
        return [f"--{name}={7 if default != 7 else 9}"]
    if flag.kind is float:
        return [f"--{name}={0.5 if default != 0.5 else 0.25}"]
    return [f"--{name}=x"]


def test_every_flag_changes_the_config_and_is_read_by_the_trainer() -> None:
    """No dead flags: each flag changes its field, and each field is read outside config.py."""
    baseline = config_from_args(MODEL)
    for flag in FLAGS:
        argv = _non_default(flag.name)
        if not argv:
            continue
        changed = config_from_args([*MODEL, *argv])
        assert getattr(changed, flag.name) != getattr(baseline, flag.name), flag.name
    sources = "".join(
        path.read_text()
        for path in Path(__file__).resolve().parents[3].joinpath("src/lrft/trainer").glob("*.py")
        if path.name != "config.py"
    )
    sources += (
        (Path(__file__).resolve().parents[3] / "src/lrft/trainer/config.py")
        .read_text()
        .split("def checkpoint_dir", 1)[1]
    )
    for flag in FLAGS:
        assert re.search(rf"config\.{flag.name}\b|self\.{flag.name}\b", sources), flag.name


def test_engine_type_has_one_choice() -> None:
    flag = next(f for f in FLAGS if f.name == "engine_type")
    assert flag.choices == ("hf",)
