"""``lrft train-rm``'s settings: one flag per field, no dead flags, bad values named with their
rule before anything starts, config files, the demo's defaults."""

from __future__ import annotations

import json
import re
from pathlib import Path

import attrs
import pytest

from lrft.api.errors import ConfigError
from lrft.cli import main
from lrft.cli.train_rm import RM_FLAGS, config_from_args
from lrft.rm import RMTrainConfig
from lrft.rm.demo import DEMO_RM_SETTINGS

ROOT = Path(__file__).resolve().parents[3]
MODEL = ["train-rm", "--pretrain=m", "--dataset=d.jsonl"]


def test_one_flag_per_field() -> None:
    assert [flag.name for flag in RM_FLAGS] == [f.name for f in attrs.fields(RMTrainConfig)]


def _non_default(name: str) -> list[str]:
    special = {
        "pretrain": ["--pretrain=other"],
        "dataset": ["--dataset=other.jsonl"],
        "eval_dataset": ["--eval_dataset=e.jsonl"],
        "generative": ["--generative"],
        "response_key": ["--generative", "--response_key=x"],
        "verdict_key": ["--generative", "--verdict_key=x"],
        "reference_key": ["--generative", "--reference_key=x"],
        "grm_template": ["--generative", "--grm_template=pointwise-score-tag"],
        "lr_scheduler": ["--lr_scheduler=cosine"],
        "zero_stage": ["--zero_stage=3"],
        "deepspeed_config": ["--zero_stage=3", "--deepspeed_config=ds.json"],
        "load_checkpoint": ["--load_checkpoint"],
        "overwrite_output": ["--overwrite_output"],
        "train_batch_size": ["--train_batch_size=64"],
        "micro_train_batch_size": ["--micro_train_batch_size=4"],
        "eval_steps": ["--eval_dataset=e.jsonl", "--eval_steps=7"],
        # off for a run of one's own model (on for the demo, when tensorboard is installed)
        "use_tensorboard": ["--use_tensorboard"],
        "step_separator": ["--step_separator=;"],
        "steps_key": ["--step_separator=;", "--steps_key=x"],
        "step_labels_key": ["--step_separator=;", "--step_labels_key=x"],
    }
    if name in special:
        return special[name]
    flag = next(f for f in RM_FLAGS if f.name == name)
    default = attrs.fields_dict(RMTrainConfig)[name].default
    if flag.kind is bool:
        return [f"--{name}" if not default else f"--no-{name}"]
    if flag.kind is float:
        return [f"--{name}={0.5 if default != 0.5 else 0.25}"]
    if flag.kind is str:
        return [f"--{name}=x"]
    return [f"--{name}={7 if default != 7 else 9}"]


def test_every_flag_changes_its_field_and_is_read() -> None:
    """No dead flags: each flag changes its field, and each field is read outside config.py."""
    baseline = config_from_args(MODEL)
    for flag in RM_FLAGS:
        changed = config_from_args([*MODEL, *_non_default(flag.name)])
        assert getattr(changed, flag.name) != getattr(baseline, flag.name), flag.name
    sources = "".join(
        path.read_text() for path in (ROOT / "src/lrft/rm").glob("*.py") if path.name != "config.py"
    )
    sources += (ROOT / "src/lrft/rm/config.py").read_text().split("def judge_template", 1)[1]
    # the run-folder rules lrft train and lrft train-rm share
    sources += (ROOT / "src/lrft/run/outputs.py").read_text()
    for flag in RM_FLAGS:
        assert re.search(rf"config\.{flag.name}\b|self\.{flag.name}\b", sources), flag.name


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--margin_key=m", "--generative"], r"margin_key 'm' applies to scalar training"),
        (["--chosen_key=c", "--generative"], r"chosen_key 'c' applies to scalar training"),
        (["--verdict_key=v"], r"verdict_key 'v' applies to --generative"),
        (["--steps_key=s"], r"steps_key 's' applies to --step_separator"),
        (["--step_separator=;", "--generative"], r"step_separator trains a process reward model"),
        (["--step_separator=;", "--chosen_key=c"], r"chosen_key 'c' applies to preference pairs"),
        (
            ["--grm_template=pairwise-boxed"],
            r"grm_template 'pairwise-boxed' applies to --generative",
        ),
        (
            ["--generative", "--grm_template=pairwise-boxed"],
            r"shows the reference answer: set --reference_key",
        ),
        (["--generative", "--grm_template=nope"], r"neither a built-in .* nor a JSON or YAML file"),
        (["--deepspeed_config=ds.json"], r"deepspeed_config 'ds.json' needs zero_stage"),
        (["--zero_stage=4"], r"zero_stage must be 1, 2 or 3"),
        (["--load_checkpoint", "--overwrite_output"], r"choose one"),
        (["--eval_steps=5"], r"eval_steps 5 needs --eval_dataset"),
        (
            ["--micro_train_batch_size=5"],
            r"micro_train_batch_size 5 must divide train_batch_size 32",
        ),
        (["--learning_rate=0"], r"learning_rate must be > 0"),
        (["--lr_warmup_steps=-1"], r"lr_warmup_steps must be an integer >= 0"),
    ],
)
def test_bad_settings_name_the_value_and_the_rule(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_args([*MODEL, *argv])


def test_a_mode_rule_and_a_run_rule_broken_together_are_reported_together() -> None:
    with pytest.raises(ConfigError) as refused:
        RMTrainConfig(
            pretrain="m",
            dataset="d.jsonl",
            step_separator="",
            load_checkpoint=True,
            overwrite_output=True,
        )
    assert refused.value.problems == (
        "step_separator trains a process reward model: a non-empty text, and not with "
        "--generative (a judge)",
        "load_checkpoint continues the run in save_path, overwrite_output replaces it with a new "
        "one: choose one",
    )


def test_model_and_data_come_together() -> None:
    with pytest.raises(ConfigError, match=r"pretrain needs --dataset"):
        config_from_args(["train-rm", "--pretrain=m"])
    with pytest.raises(ConfigError, match=r"dataset and eval_dataset need --pretrain"):
        config_from_args(["train-rm", "--dataset=d.jsonl"])
    with pytest.raises(ConfigError, match=r"--generative needs --pretrain and --dataset"):
        RMTrainConfig(generative=True)


def test_world_rule_names_the_formula() -> None:
    config = config_from_args([*MODEL, "--train_batch_size=8", "--micro_train_batch_size=4"])
    config.validate_world(2)
    with pytest.raises(
        ConfigError, match=r"multiple of micro_train_batch_size \* world_size = 4 \* 3 = 12"
    ):
        config.validate_world(3)


def test_the_demo_fills_in_what_is_left_unset() -> None:
    demo = config_from_args(["train-rm", "--learning_rate=1e-3"])
    assert demo.pretrain is None
    assert demo.learning_rate == 1e-3
    assert demo.max_epochs == DEMO_RM_SETTINGS["max_epochs"]
    assert config_from_args(MODEL).max_epochs == 1  # a user's model: the plain defaults


def test_config_file_and_command_line(tmp_path: Path) -> None:
    path = tmp_path / "rm.json"
    path.write_text(json.dumps({"pretrain": "m", "dataset": "d.jsonl", "learning_rate": 0.01}))
    config = config_from_args(["train-rm", f"--config={path}", "--learning_rate=0.02"])
    assert (config.pretrain, config.learning_rate) == ("m", 0.02)
    path.write_text(json.dumps({"pretrain": "m", "lr": 0.01}))
    with pytest.raises(ConfigError, match=r"unknown keys \['lr'\]"):
        config_from_args(["train-rm", f"--config={path}"])


def test_cli_reports_config_errors_before_starting(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train-rm", "--pretrain=m"]) == 2
    assert "lrft train-rm: configuration error: pretrain needs --dataset" in capsys.readouterr().err
