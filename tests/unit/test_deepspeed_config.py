"""``DeepSpeedConfig``: the DeepSpeed config it generates, and how a user override merges.

Most of these need no deepspeed; the last ones parse the generated dicts with DeepSpeed's own
config class, where deepspeed is installed, to check that it reads back what lrft meant.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lrft.api.errors import ConfigError
from lrft.backends.train.deepspeed import (
    DeepSpeedConfig,
    ZeroStage,
    merge_override,
    read_override,
)


def _generated(config: DeepSpeedConfig, **kwargs: Any) -> dict[str, Any]:
    arguments: dict[str, Any] = {"world_size": 2, "mixed_precision": False, "max_grad_norm": 1.0}
    arguments.update(kwargs)
    return config.deepspeed_config(**arguments)


def test_generated_config_owns_accumulation_and_clipping() -> None:
    generated = _generated(DeepSpeedConfig(zero_stage=2), world_size=4, max_grad_norm=0.5)
    assert generated["gradient_accumulation_steps"] == 1
    assert generated["train_micro_batch_size_per_gpu"] == 1
    assert generated["train_batch_size"] == 4
    assert generated["managed_gradient_accumulation"] is False
    assert generated["gradient_clipping"] == 0.5
    assert generated["bf16"] == {"enabled": False}
    assert "optimizer" not in generated
    assert "scheduler" not in generated
    assert generated["zero_optimization"]["stage"] == 2
    assert generated["zero_optimization"]["compute_grad_norm"] is True


@pytest.mark.parametrize("max_grad_norm", [0.0, -1.0])
def test_non_positive_max_grad_norm_disables_clipping(max_grad_norm: float) -> None:
    assert _generated(DeepSpeedConfig(), max_grad_norm=max_grad_norm)["gradient_clipping"] == 0.0


def test_frozen_config_leaves_clipping_out() -> None:
    assert "gradient_clipping" not in _generated(DeepSpeedConfig(), max_grad_norm=None)


def test_stage3_keys_only_at_stage_3() -> None:
    config = DeepSpeedConfig(zero_stage=2, param_persistence_threshold=0, prefetch_bucket_size=7)
    assert not any(key.startswith("stage3_") for key in _generated(config)["zero_optimization"])
    zero3 = _generated(config, zero_stage=3)["zero_optimization"]
    assert zero3["stage"] == 3
    assert zero3["stage3_param_persistence_threshold"] == 0
    assert zero3["stage3_prefetch_bucket_size"] == 7


def test_stage1_never_overlaps_communication() -> None:
    # DeepSpeed 0.19.8 refuses overlap_comm at stage 1 when step() owns the boundary.
    assert (
        _generated(DeepSpeedConfig(zero_stage=1, overlap_comm=True))["zero_optimization"][
            "overlap_comm"
        ]
        is False
    )
    stage2 = _generated(DeepSpeedConfig(zero_stage=2, overlap_comm=True))["zero_optimization"]
    assert stage2["overlap_comm"] is True
    assert "overlap_comm" not in _generated(DeepSpeedConfig(zero_stage=2))["zero_optimization"]


def test_frozen_models_partitioned_by_default_only_at_stage_3() -> None:
    assert DeepSpeedConfig(zero_stage=3).partitions_frozen
    assert not DeepSpeedConfig(zero_stage=2).partitions_frozen
    assert DeepSpeedConfig(zero_stage=1, frozen_zero3=True).partitions_frozen
    assert not DeepSpeedConfig(zero_stage=3, frozen_zero3=False).partitions_frozen


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("zero_stage", 0),
        ("zero_stage", 4),
        ("zero_stage", True),
        ("reduce_bucket_size", 0),
        ("param_persistence_threshold", -1),
        ("max_live_parameters", 1.5),
    ],
)
def test_invalid_fields_raise(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        DeepSpeedConfig(**{field: value})  # type: ignore[arg-type]


def test_override_adds_new_keys_recursively() -> None:
    override = {"zero_optimization": {"round_robin_gradients": True}, "comms_logger": {"x": 1}}
    generated = _generated(DeepSpeedConfig(zero_stage=2, override=override))
    assert generated["zero_optimization"]["round_robin_gradients"] is True
    assert generated["zero_optimization"]["stage"] == 2  # the rest of the object survives
    assert generated["comms_logger"] == {"x": 1}


def test_override_may_repeat_a_generated_value() -> None:
    override = {
        "zero_optimization": {"stage": 3},
        "gradient_clipping": 1,
        "bf16": {"enabled": False},
    }
    generated = _generated(DeepSpeedConfig(zero_stage=3, override=override))
    assert generated["zero_optimization"]["stage"] == 3
    assert generated["gradient_clipping"] == 1.0


def test_conflicting_override_names_the_key_and_the_lrft_setting() -> None:
    with pytest.raises(
        ConfigError, match=r"zero_optimization\.stage=2.*DeepSpeedConfig\.zero_stage"
    ):
        DeepSpeedConfig(zero_stage=3, override={"zero_optimization": {"stage": 2}})


def test_conflicts_that_depend_on_the_run_surface_when_generating() -> None:
    config = DeepSpeedConfig(override={"gradient_clipping": 2.0, "bf16": {"enabled": True}})
    with pytest.raises(ConfigError, match=r"gradient_clipping.*OptimizerConfig\.max_grad_norm"):
        _generated(config, mixed_precision=True, max_grad_norm=1.0)
    with pytest.raises(ConfigError, match=r"bf16\.enabled.*DeepSpeedConfig\.mixed_precision"):
        _generated(config, mixed_precision=False, max_grad_norm=2.0)
    assert _generated(config, mixed_precision=True, max_grad_norm=2.0)["bf16"] == {"enabled": True}


def test_json_types_are_compared_as_json() -> None:
    # true is not 1 in JSON, although True == 1 in Python.
    with pytest.raises(ConfigError, match="managed_gradient_accumulation"):
        DeepSpeedConfig(override={"managed_gradient_accumulation": 0})
    with pytest.raises(ConfigError, match="stage"):
        DeepSpeedConfig(zero_stage=1, override={"zero_optimization": {"stage": True}})
    assert merge_override({"a": 1}, {"a": 1.0}) == {"a": 1}


@pytest.mark.parametrize(
    "override",
    [
        {"optimizer": {"type": "AdamW"}},
        {"scheduler": {"type": "WarmupLR"}},
        {"fp16": {"enabled": False}},
        {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}},
        {"zero_optimization": {"offload_param": {"device": "cpu"}}},
        {"gradient_accumulation_steps": 1},
        {"train_batch_size": 8},
        {"train_micro_batch_size_per_gpu": 2},
    ],
)
def test_keys_lrft_owns_are_refused(override: dict[str, Any]) -> None:
    key = next(iter(override))
    with pytest.raises(ConfigError, match=f"may not set '{key}"):
        DeepSpeedConfig(override=override)


@pytest.mark.parametrize("override", [{"a": float("nan")}, {"a": object()}, {1: 2}, ["a"]])
def test_override_must_be_plain_json(override: Any) -> None:
    with pytest.raises(ConfigError, match="JSON"):
        DeepSpeedConfig(override=override)


def test_override_is_copied() -> None:
    override: dict[str, Any] = {"zero_optimization": {"round_robin_gradients": True}}
    config = DeepSpeedConfig(override=override)
    override["zero_optimization"]["round_robin_gradients"] = False
    generated = _generated(config)
    generated["zero_optimization"]["round_robin_gradients"] = "changed"
    assert config.override == {"zero_optimization": {"round_robin_gradients": True}}
    assert _generated(config)["zero_optimization"]["round_robin_gradients"] is True


def test_read_override(tmp_path: Path) -> None:
    good = tmp_path / "ds.json"
    good.write_text(json.dumps({"zero_optimization": {"round_robin_gradients": True}}))
    assert read_override(good) == {"zero_optimization": {"round_robin_gradients": True}}
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        read_override(broken)
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="JSON object"):
        read_override(listed)


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )


def test_importing_lrft_and_the_backend_module_never_imports_deepspeed() -> None:
    code = (
        "import sys, lrft, lrft.backends.train.deepspeed as m\n"
        "m.DeepSpeedConfig(zero_stage=3).deepspeed_config("
        "world_size=1, mixed_precision=False, max_grad_norm=1.0)\n"
        "assert 'deepspeed' not in sys.modules, 'deepspeed was imported'\n"
    )
    result = _python(code)
    assert result.returncode == 0, result.stderr


def test_missing_deepspeed_names_the_extra() -> None:
    code = (
        "import sys\n"
        "sys.modules['deepspeed'] = None  # what Python does for a package that is not there\n"
        "from lrft.backends.train.deepspeed import DeepSpeedBackend\n"
        "try:\n"
        "    DeepSpeedBackend()\n"
        "except ImportError as error:\n"
        "    print(error)\n"
        "else:\n"
        "    raise SystemExit('no ImportError')\n"
    )
    result = _python(code)
    assert result.returncode == 0, result.stderr
    assert "pip install 'lrft[deepspeed]'" in result.stdout


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_reads_back_the_generated_config(stage: ZeroStage) -> None:
    pytest.importorskip(
        "deepspeed", reason="deepspeed is not installed: pip install 'lrft[deepspeed]'"
    )
    from deepspeed.runtime.config import DeepSpeedConfig as ParsedConfig

    config = DeepSpeedConfig(
        zero_stage=stage,
        reduce_bucket_size=12345,
        param_persistence_threshold=0,
        override={"zero_optimization": {"round_robin_gradients": True}},
    )
    generated = _generated(config, world_size=1, max_grad_norm=0.25)
    parsed = ParsedConfig(generated)
    assert parsed.zero_optimization_stage == stage
    assert parsed.zero_config.reduce_bucket_size == 12345
    assert parsed.zero_config.round_robin_gradients is True
    assert parsed.gradient_clipping == 0.25
    assert parsed.gradient_accumulation_steps == 1
    assert parsed.managed_gradient_accumulation is False
    assert parsed.bfloat16_config.enabled is False
    if stage == 3:
        assert parsed.zero_config.param_persistence_threshold == 0
