"""Validation of the policy-loss and sampling flags: each bad value or combination is refused
before any process starts, with the value and the rule in the message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lrft.api.errors import ConfigError
from lrft.cli import config_from_args, main
from lrft.config import TrainConfig

MODEL = ["train", "--pretrain=m", "--prompt_data=p.jsonl", "--reward_fn=math"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"policy_loss_type": "nope"}, r"policy_loss_type 'nope' is unknown; .*cpgd, gmpo, gspo"),
        ({"eps_clip_low_high": (1.2, 0.3)}, r"\(1.2, 0.3\): LOW must be in \(0, 1\) and HIGH > 0"),
        ({"eps_clip_low_high": (0.2, -0.1)}, r"LOW must be in \(0, 1\) and HIGH > 0"),
        ({"eps_clip_low_high": [0.2]}, r"eps_clip_low_high must be two numbers LOW HIGH"),
        (
            {"eps_clip_low_high": (0.2, 0.28), "eps_clip": 0.3},
            r"eps_clip 0.3 and eps_clip_low_high \(0.2, 0.28\) are both set",
        ),
        ({"eps_clip": 1.5}, r"eps_clip must be in \(0, 1\), got 1.5"),
        ({"dual_clip": 0.5}, r"dual_clip must be > 1 .*got 0.5"),
        (
            {"dual_clip": 3.0, "policy_loss_type": "gspo"},
            r"policy_loss_type 'gspo': .*does not read dual_clip",
        ),
        (
            {"dual_clip": 3.0, "policy_loss_type": "cpgd"},
            r"policy_loss_type 'cpgd': .*does not read dual_clip",
        ),
        ({"loss_agg_mode": "mean"}, r"loss_agg_mode 'mean' is unknown; choose one of token-mean"),
        (
            {"loss_agg_mode": "token-mean", "policy_loss_type": "gspo"},
            r"loss_agg_mode applies to token-level losses, but policy_loss_type 'gspo' is "
            r"sequence-level",
        ),
        (
            {"high_entropy_token_ratio": 0.2, "policy_loss_type": "gmpo"},
            r"high_entropy_token_ratio applies to token-level losses.* 'gmpo'",
        ),
        ({"high_entropy_token_ratio": 1.0}, r"high_entropy_token_ratio must be in \[0, 1\).*1.0"),
        ({"entropy_loss_coef": -0.1}, r"entropy_loss_coef must be >= 0, got -0.1"),
        ({"tis_cap": 3.0}, r"tis_cap 3.0 is read only with use_tis"),
        ({"use_tis": True, "tis_cap": 0.0}, r"tis_cap must be > 0, got 0.0"),
        (
            {"overlong_buffer_len": 9, "generate_max_len": 8},
            r"overlong_buffer_len 9 exceeds generate_max_len 8",
        ),
        ({"overlong_buffer_len": 0}, r"overlong_buffer_len must be a positive integer, got 0"),
        (
            {"overlong_penalty_factor": 0.5},
            r"overlong_penalty_factor 0.5 is read only with overlong_buffer_len",
        ),
        (
            {"fire_first_token_temperature": 5.0},
            r"fire_first_token_temperature 5.0 is read only with use_fire_sampling",
        ),
        (
            {"use_fire_sampling": True, "fire_first_token_temperature": 0.0},
            r"fire_first_token_temperature must be > 0, got 0.0",
        ),
        ({"max_num_gen_batches": 3}, r"max_num_gen_batches 3 is read only with dynamic_sampling"),
        (
            {"dynamic_sampling": True, "max_num_gen_batches": 0},
            r"max_num_gen_batches must be a positive integer, got 0",
        ),
        (
            {
                "dynamic_sampling": True,
                "n_samples_per_prompt": 1,
                "train_batch_size": 32,
                "advantage_estimator": "reinforce",
            },
            r"dynamic_sampling .* needs n_samples_per_prompt >= 2, got 1",
        ),
    ],
)
def test_invalid_algorithm_settings_are_named(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**changes)  # type: ignore[arg-type]


def test_the_cli_refuses_a_bad_combination_before_starting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*MODEL, "--policy_loss_type=gspo", "--dual_clip=2"]) == 2
    assert "policy_loss_type 'gspo'" in capsys.readouterr().err


def test_defaults_of_the_optional_settings() -> None:
    config = TrainConfig(use_tis=True, use_fire_sampling=True, dynamic_sampling=True)
    assert config.truncated_is_cap == 2.0
    assert config.first_token_temperature == 10.0
    assert config.generate_rounds == 4
    off = TrainConfig()
    assert (off.truncated_is_cap, off.first_token_temperature, off.generate_rounds) == (
        None,
        None,
        1,
    )
    assert TrainConfig(overlong_buffer_len=2).overlong_factor == 1.0


def test_clip_bounds_from_the_command_line_and_a_config_file(tmp_path: Path) -> None:
    config = config_from_args([*MODEL, "--eps_clip_low_high", "0.2", "0.28"])
    assert config.eps_clip_low_high == (0.2, 0.28)
    loss = config.policy_loss_config()
    assert (loss.clip_low, loss.clip_high) == (0.2, 0.28)
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"eps_clip_low_high": [0.1, 0.3], "policy_loss_type": "cpgd"}))
    from_file = config_from_args([*MODEL, f"--config={path}"])
    assert from_file.eps_clip_low_high == (0.1, 0.3)
    assert from_file.policy_loss_type == "cpgd"
    json.dumps(from_file.as_dict())  # the checkpoint manifest stores it


def test_sum_norm_aggregation_divides_by_the_generation_limit() -> None:
    config = TrainConfig(loss_agg_mode="seq-mean-token-sum-norm", generate_max_len=6)
    assert config.policy_loss_config().max_len == 6
    assert TrainConfig(loss_agg_mode="seq-mean-token-sum").policy_loss_config().max_len is None
