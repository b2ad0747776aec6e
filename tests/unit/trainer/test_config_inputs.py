"""Model folders, prompt files and credential variables, checked before any process group: each
broken folder is one that transformers itself cannot load, and the error names flag, path and
what is missing, in one line, with exit code 2."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from lrft.api.errors import ConfigError
from lrft.cli import main
from lrft.config import TrainConfig
from tests.trainer.fixtures import make_model_folder, make_prompt_files


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_folder(tmp_path_factory.mktemp("model") / "model")


def _copy(good: Path, target: Path, drop: tuple[str, ...] = ()) -> Path:
    shutil.copytree(good, target)
    for name in drop:
        (target / name).unlink()
    return target


def _loads(folder: Path) -> bool:
    """Whether transformers makes a working tokenizer and model of the folder, as the trainer
    does with --pretrain: the reference for what a folder needs. (Without a vocabulary file,
    transformers 5.24 builds a Qwen2 tokenizer that encodes every text to no tokens.)"""
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        AutoModelForCausalLM.from_pretrained(folder)
    except (OSError, ValueError, TypeError):
        return False
    return len(tokenizer("12+35=")["input_ids"]) > 0


def _empty(good: Path, target: Path) -> Path:
    target.mkdir()
    return target


def _bad_config(good: Path, target: Path) -> Path:
    (_copy(good, target) / "config.json").write_text("{")
    return target


def _sharded(good: Path, target: Path) -> Path:
    folder = _copy(good, target, drop=("model.safetensors",))
    index = {"metadata": {}, "weight_map": {"lm_head.weight": "model-00001-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


BROKEN: dict[str, tuple[Callable[[Path, Path], Path], str]] = {
    "missing": (lambda good, t: t, r"--pretrain '.*missing': no such folder \(expected a Hugging"),
    "file": (
        lambda good, t: Path(shutil.copy(good / "config.json", t)),
        r"--pretrain '.*file' is a file, not a folder",
    ),
    "empty": (_empty, r"--pretrain '.*empty' has no config.json"),
    "bad_config": (_bad_config, r"config.json cannot be read as JSON"),
    "no_weights": (
        lambda good, t: _copy(good, t, drop=("model.safetensors",)),
        r"has no weights \(none of model.safetensors, model.safetensors.index.json, pytorch_mod",
    ),
    "lost_shard": (
        _sharded,
        r"model.safetensors.index.json names shard\(s\) that are missing: model-00001-of-00002",
    ),
    "no_tokenizer": (
        lambda good, t: _copy(good, t, drop=("tokenizer.json",)),
        r"has no tokenizer files \(none of tokenizer.json, .*save the tokenizer",
    ),
}


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_a_folder_transformers_cannot_load_is_named_with_what_it_lacks(
    kind: str, good: Path, tmp_path: Path
) -> None:
    make, message = BROKEN[kind]
    folder = make(good, tmp_path / kind)
    assert not _loads(folder)
    config = TrainConfig(pretrain=str(folder), prompt_data=str(good), reward_fn="math")
    with pytest.raises(ConfigError, match=message) as info:
        config.validate_inputs()
    assert "\n" not in str(info.value)


def test_a_good_folder_passes_and_loads(good: Path) -> None:
    assert _loads(good)
    TrainConfig(pretrain=str(good), prompt_data=str(good), reward_fn="math").validate_inputs()


def test_every_model_flag_is_checked_and_the_critic_needs_no_tokenizer(
    good: Path, tmp_path: Path
) -> None:
    no_tokenizer = _copy(good, tmp_path / "critic", drop=("tokenizer.json",))
    AutoConfig.from_pretrained(no_tokenizer)  # all a critic folder needs besides weights
    base: dict[str, Any] = {"pretrain": str(good), "prompt_data": str(good), "reward_fn": "math"}
    TrainConfig(
        **base, advantage_estimator="gae", critic_pretrain=str(no_tokenizer)
    ).validate_inputs()
    cases: list[tuple[dict[str, Any], str]] = [
        ({"reward_pretrain": [str(good), str(tmp_path / "rm")]}, r"--reward_pretrain '.*rm': no"),
        ({"reward_pretrain": [str(no_tokenizer)]}, r"--reward_pretrain '.*' has no tokenizer"),
        (
            {"advantage_estimator": "gae", "critic_pretrain": str(tmp_path / "nothing")},
            r"--critic_pretrain '.*nothing': no such folder",
        ),
        ({"prompt_data": str(tmp_path / "p.jsonl")}, r"--prompt_data '.*p.jsonl': no such file"),
        ({"eval_dataset": str(tmp_path / "e.jsonl")}, r"--eval_dataset '.*e.jsonl': no such"),
        (
            {"zero_stage": 2, "deepspeed_config": str(tmp_path / "ds.json")},
            r"--deepspeed_config '.*ds.json': no such file or folder \(a DeepSpeed JSON file\)",
        ),
    ]
    for changes, message in cases:
        with pytest.raises(ConfigError, match=message):
            TrainConfig(**(base | changes)).validate_inputs()


def test_the_cli_prints_one_line_and_exits_2_before_any_process_group(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train, _ = make_prompt_files(tmp_path / "data")
    missing = tmp_path / "no" / "such" / "model"
    code = main(["train", f"--pretrain={missing}", f"--prompt_data={train}", "--reward_fn=math"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"lrft: configuration error: --pretrain {str(missing)!r}: no such folder (expected a "
        "Hugging Face model folder (config.json, weights, tokenizer files))"
    ]
    assert not dist.is_initialized()


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        ({"pretrain": "Qwen/Qwen2.5-0.5B-Instruct"}, "pretrain"),
        ({"prompt_data": "openai/gsm8k"}, "prompt_data"),
    ],
)
def test_a_hub_id_is_named_as_one_with_the_way_to_fetch_it(
    good: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, changes: dict[str, str], flag: str
) -> None:
    monkeypatch.chdir(tmp_path)  # no folder of that name here
    base: dict[str, Any] = {"pretrain": str(good), "prompt_data": str(good), "reward_fn": "math"}
    (value,) = changes.values()
    with pytest.raises(ConfigError) as raised:
        TrainConfig(**(base | changes)).validate_inputs()
    message = str(raised.value)
    assert message.startswith(f"--{flag} {value!r}: no such")
    assert f"{value!r} looks like a Hugging Face Hub id" in message
    assert "reads local files and folders only and downloads nothing" in message
    assert f"--local-dir ./{value.split('/')[-1]}" in message


def test_a_missing_local_path_gets_no_hub_word(good: Path, tmp_path: Path) -> None:
    for missing in (str(tmp_path / "model"), "./org/model", "model"):
        with pytest.raises(ConfigError) as raised:
            TrainConfig(pretrain=missing, prompt_data=str(good), reward_fn="math").validate_inputs()
        assert "Hub id" not in str(raised.value), missing


URL = "http://127.0.0.1:9/score"


def test_auth_variables_are_named_never_their_values(
    good: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def config(names: str) -> TrainConfig:
        return TrainConfig(
            pretrain=str(good), prompt_data=str(good), remote_rm_url=URL, remote_rm_auth_env=names
        )

    monkeypatch.delenv("LRFT_TEST_TOKEN", raising=False)
    with pytest.raises(ConfigError, match=r"variable LRFT_TEST_TOKEN is not set"):
        config("LRFT_TEST_TOKEN").validate_inputs()
    monkeypatch.setenv("LRFT_TEST_TOKEN", "")
    with pytest.raises(ConfigError, match=r"variable LRFT_TEST_TOKEN is empty"):
        config("LRFT_TEST_TOKEN").validate_inputs()
    monkeypatch.setenv("LRFT_TEST_TOKEN", "tok-\nsecret")
    with pytest.raises(ConfigError, match=r"has a line break") as info:
        config("LRFT_TEST_TOKEN").validate_inputs()
    assert "secret" not in str(info.value)
    monkeypatch.setenv("LRFT_TEST_TOKEN", "tok-ok")
    config("LRFT_TEST_TOKEN").validate_inputs()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"remote_rm_auth_env": "TOKEN"}, r"remote_rm_auth_env applies to remote_rm_url"),
        (
            {"remote_rm_url": f"{URL},{URL}", "remote_rm_auth_env": "TOKEN"},
            r"remote_rm_auth_env has 1 entries for 2 remote_rm_url: give one variable name",
        ),
        (
            {"remote_rm_url": URL, "remote_rm_auth_env": "Bearer abc"},
            r"entry 'Bearer abc' is not an environment variable name .* never the token",
        ),
        ({"remote_rm_url": URL, "remote_rm_auth_env": ","}, r"names no variable"),
        (
            {"remote_rm_url": "http://u:pw@h/x", "remote_rm_auth_env": "TOKEN"},
            r"entry 'http://\*\*\*@h/x' has credentials in it .* both would set its Authoriz",
        ),
        (
            {"remote_rm_url": URL, "remote_rm_timeout_s": 100.0, "collective_timeout_s": 300.0},
            r"collective_timeout_s 300 must exceed the 301.5 s that 1 reward service\(s\) may",
        ),
    ],
)
def test_auth_variable_and_wait_rules(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainConfig(pretrain="m", prompt_data="p", reward_fn="math", **changes)  # type: ignore[arg-type]
