"""LoRA settings: the flags, their rules, and the checks of the adapters against the model that
run before any process group starts (a name that matches nothing, a module lrft cannot merge,
a model peft cannot wrap, a missing peft)."""

from __future__ import annotations

import builtins
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from transformers import GPT2Config

from lrft.api.errors import ConfigError
from lrft.backends.train.lora import (
    LoraSettings,
    adapted_modules,
    apply_lora,
    check_lora_model,
    require_peft,
)
from lrft.cli import config_from_args, main
from lrft.config import TrainConfig
from lrft.testing.models import tiny_causal_lm, tiny_qwen2_config

pytest.importorskip("peft", reason="peft is not installed: pip install 'lrft[lora]'")


def test_flags_make_the_settings() -> None:
    config = config_from_args(
        [
            "train",
            "--lora_rank=8",
            "--lora_alpha=32",
            "--lora_dropout=0.05",
            "--target_modules",
            "q_proj",
            "v_proj,o_proj",
        ]
    )
    assert config.lora == LoraSettings(
        rank=8, alpha=32, dropout=0.05, target_modules=("q_proj", "v_proj", "o_proj")
    )
    assert config.lora.scaling == 4.0
    assert config_from_args(["train"]).lora is None


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--lora_alpha=8"], r"lora_alpha 8 shapes LoRA adapters, but lora_rank is 0"),
        (["--target_modules", "q_proj"], r"target_modules \('q_proj',\) .* set lora_rank"),
        (["--lora_rank=-1"], r"lora_rank must be an integer >= 0, got -1"),
        (["--lora_rank=4", "--lora_dropout=1"], r"lora_dropout must be in \[0, 1\), got 1.0"),
        (["--lora_rank=4", "--lora_alpha=0"], r"lora_alpha must be"),
    ],
)
def test_bad_settings_are_refused(argv: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        config_from_args(["train", *argv])


def test_missing_peft_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"lora_rank 8 needs the peft package.*lrft\[lora\]"):
        TrainConfig(lora_rank=8)
    real_import = builtins.__import__

    def no_peft(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "peft" or name.startswith("peft."):
            raise ImportError("No module named 'peft'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_peft)
    with pytest.raises(ImportError, match=r"LoRA needs peft: pip install 'lrft\[lora\]'"):
        require_peft()


def test_all_linear_adapts_every_linear_module_but_the_head() -> None:
    model = tiny_causal_lm(0)
    found = adapted_modules(model, LoraSettings(rank=4))
    linear = [
        name
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and name != "lm_head"
    ]
    assert found == sorted(linear)
    assert len(found) == 14
    suffixes = adapted_modules(model, LoraSettings(rank=4, target_modules=("q_proj", "v_proj")))
    assert suffixes == sorted(n for n in linear if n.endswith(("q_proj", "v_proj")))


@pytest.mark.parametrize(
    ("targets", "match"),
    [
        (("q_proj", "qq_proj"), r"target_modules name 'qq_proj' matches no module of Qwen2"),
        (("embed_tokens",), r"matches model.embed_tokens \(Embedding\): lrft merges LoRA adapters"),
        (("lm_head",), r"matches lm_head \(Linear\): .* \(not the output head\)"),
    ],
)
def test_targets_lrft_cannot_adapt_are_refused(targets: tuple[str, ...], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        check_lora_model(tiny_qwen2_config(), LoraSettings(rank=4, target_modules=targets))


def test_a_model_without_linear_layers_is_refused() -> None:
    # GPT-2 computes with transformers' Conv1D (a transposed weight), not torch.nn.Linear
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    with pytest.raises(ConfigError, match=r"'all-linear': GPT2LMHeadModel has no torch.nn.Linear"):
        check_lora_model(config, LoraSettings(rank=4))


def test_only_the_adapters_train() -> None:
    model = apply_lora(tiny_causal_lm(0), LoraSettings(rank=4, target_modules=("q_proj",)))
    trainable = sorted(name for name, p in model.named_parameters() if p.requires_grad)
    assert len(trainable) == 4
    assert all(".lora_" in name for name in trainable)


def test_a_bad_target_stops_lrft_train_before_any_process_group(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["train", "--lora_rank=8", "--target_modules", "q_proj", "nope_proj"]
    assert main([*argv, f"--save_path={tmp_path / 'run'}"]) == 2
    assert "target_modules name 'nope_proj' matches no module" in capsys.readouterr().err
    assert not dist.is_initialized()
    written = json.dumps(sorted(p.name for p in (tmp_path / "run").iterdir()))
    assert "metrics" not in written
    assert "hf_model" not in written
