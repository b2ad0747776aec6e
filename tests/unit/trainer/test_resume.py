"""A resume's settings against its checkpoint's: what blocks it, what it may change."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest

from lrft.api.errors import ConfigError
from lrft.cli import config_from_args
from lrft.config import TrainConfig
from lrft.run.resume import RESUMABLE_SETTINGS, check_resume_settings, settings_changes

MODEL = ["train", "--pretrain=model", "--prompt_data=p.jsonl", "--reward_fn=math"]


def _saved(*flags: str) -> dict[str, Any]:
    """The config as a checkpoint's manifest stores it (JSON)."""
    manifest: dict[str, Any] = json.loads(json.dumps(config_from_args([*MODEL, *flags]).as_dict()))
    return manifest


def test_the_same_settings_change_nothing() -> None:
    flags = ["--eps_clip_low_high", "0.2", "0.28", "--reward_pretrain=a,b"]  # tuples as lists
    assert settings_changes(_saved(*flags), config_from_args([*MODEL, *flags])) == ([], [])


def test_each_setting_that_decides_the_run_is_named_with_both_values() -> None:
    now = config_from_args(
        [*MODEL, "--seed=7", "--rollout_batch_size=16", "--advantage_estimator=rloo"]
    )
    blocking, allowed = settings_changes(_saved(), now)
    assert blocking == [
        "rollout_batch_size 32 -> 16",
        "advantage_estimator 'group_norm' -> 'rloo'",
        "seed 42 -> 7",
    ]
    assert allowed == []
    with pytest.raises(ConfigError) as error:
        check_resume_settings({"config": _saved()}, now, Path("ck/global_step8"))
    message = str(error.value)
    assert "checkpoint ck/global_step8 was written with other settings" in message
    assert "rollout_batch_size 32 -> 16; advantage_estimator 'group_norm' -> 'rloo'" in message
    assert "fresh --save_path" in message


def test_length_cadence_logging_and_speed_may_change() -> None:
    now = config_from_args(
        [
            *MODEL,
            "--max_steps=80",
            "--eval_steps=5",
            "--save_steps=10",
            "--no-progress_bar",
            "--max_tokens_per_micro_batch=64",
            "--save_path=elsewhere",
        ]
    )
    blocking, allowed = settings_changes(_saved("--max_steps=40"), now)
    assert blocking == []
    assert allowed == [
        "max_tokens_per_micro_batch None -> 64",
        "max_steps 40 -> 80",
        "save_path './lrft_output' -> 'elsewhere'",
        "save_steps -1 -> 10",
        "eval_steps -1 -> 5",
        "progress_bar True -> False",
    ]
    assert check_resume_settings({"config": _saved("--max_steps=40")}, now, Path("c")) == allowed


def test_a_reward_service_url_is_never_shown() -> None:
    saved = _saved("--remote_rm_url=https://user:old@rm.example/score")
    now = config_from_args([*MODEL, "--remote_rm_url=https://user:new@rm.example/score"])
    assert settings_changes(saved, now) == ([], ["remote_rm_url (changed)"])


def test_a_teacher_service_may_move_and_its_url_is_never_shown() -> None:
    opd = ["--advantage_estimator=on_policy_distillation"]
    saved = _saved(*opd, "--teacher_url=https://user:old@teacher.example/generate")
    now = config_from_args([*MODEL, *opd, "--teacher_url=https://user:new@teacher.example/v2"])
    assert settings_changes(saved, now) == ([], ["teacher_url (changed)"])
    other = config_from_args([*MODEL, *opd, "--teacher_pretrain=./teacher"])
    blocking, _ = settings_changes(saved, other)
    assert "teacher_pretrain None -> './teacher'" in blocking


def test_a_setting_an_older_manifest_lacks_is_compared_as_its_default() -> None:
    saved = _saved()
    del saved["dual_clip"], saved["use_tensorboard"]
    assert settings_changes(saved, config_from_args(MODEL)) == ([], [])
    blocking, _ = settings_changes(saved, config_from_args([*MODEL, "--dual_clip=3"]))
    assert blocking == ["dual_clip None -> 3.0"]


def test_a_checkpoint_without_a_config_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"records no configuration"):
        check_resume_settings({}, config_from_args(MODEL), Path("c"))


def test_resumable_settings_are_fields() -> None:
    assert not RESUMABLE_SETTINGS - {field.name for field in attrs.fields(TrainConfig)}
