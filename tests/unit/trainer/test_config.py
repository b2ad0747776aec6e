"""Config validation (before any process group) and the command line: every flag has an effect."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

from lrft.api.errors import ConfigError
from lrft.backends import registry
from lrft.cli import config_from_args, main
from lrft.cli.flags import FLAGS
from lrft.config import HF_DECODE_PATHS, WANDB_SETTINGS, TrainConfig
from lrft.demos import DEMO_CRITIC_SETTINGS, DEMO_SETTINGS
from lrft.extras import tensorboard_available, wandb_available
from tests.installed import pretend_installed

MODEL = ["train", "--pretrain=m", "--prompt_data=p.jsonl", "--reward_fn=math"]

KNOB_VALUES: dict[str, list[str]] = {
    "lr_scheduler": ["--lr_scheduler=cosine"],
    "min_lr_ratio": ["--lr_scheduler=cosine", "--min_lr_ratio=0.2"],
    "adam_betas": ["--adam_betas", "0.9", "0.95"],
    "kl_target": ["--init_kl_coef=0.1", "--kl_target=0.05"],
    "kl_horizon": ["--init_kl_coef=0.1", "--kl_target=0.05", "--kl_horizon=20000"],
    "system_prompt": ["--apply_chat_template", "--system_prompt=x"],
    "prompt_data_probs": ["--prompt_data=a.jsonl,b.jsonl", "--prompt_data_probs=0.3,0.7"],
    "eval_split": ["--eval_split=test"],
    "attn_implementation": ["--attn_implementation=eager"],
    "train_backend": ["--train_backend=fsdp2"],
    "weight_sync": ["--plugins=tests.unit._plugins.backends", "--weight_sync=counting"],
    "plugins": ["--plugins=tests.unit._plugins.algorithms"],
}
"""A command line that sets each of these flags away from its default (still valid)."""


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


def test_vllm_missing_is_refused_before_starting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pretend_installed(monkeypatch, vllm=False)
    with pytest.raises(
        ConfigError, match=r"engine_type 'vllm' needs .* pip install 'lrft\[vllm\]'"
    ):
        TrainConfig(engine_type="vllm")
    assert main([*MODEL, "--engine_type=vllm"]) == 2
    assert "pip install 'lrft[vllm]'" in capsys.readouterr().err


def test_vllm_tp_size_is_bounded_by_the_world_only(monkeypatch: pytest.MonkeyPatch) -> None:
    pretend_installed(monkeypatch, vllm=True)
    TrainConfig(engine_type="vllm", engine_tp_size=4).validate_world(4)
    with pytest.raises(ConfigError, match=r"world size 2 is not divisible by engine_tp_size 4"):
        TrainConfig(engine_type="vllm", engine_tp_size=4).validate_world(2)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"engine_mem_util": 0.3}, r"engine_mem_util 0.3 sizes .* engine 'hf' reserves none"),
        ({"engine_type": "vllm", "engine_mem_util": 0.0}, r"must be in \(0, 1\], got 0.0"),
        ({"engine_type": "vllm", "engine_mem_util": 1.5}, r"must be in \(0, 1\], got 1.5"),
    ],
)
def test_engine_mem_util_values_are_named(
    monkeypatch: pytest.MonkeyPatch, changes: dict[str, object], message: str
) -> None:
    pretend_installed(monkeypatch, vllm=True)
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**changes)  # type: ignore[arg-type]


def test_engine_memory_share_by_device(monkeypatch: pytest.MonkeyPatch) -> None:
    pretend_installed(monkeypatch, vllm=True)
    unset = TrainConfig(engine_type="vllm")
    set_ = TrainConfig(engine_type="vllm", engine_mem_util=0.3)
    # a GPU per rank: LightRFT's default half, or the value given
    assert unset.engine_memory_share(local_world_size=8, on_cuda=True, environ={}) == 0.5
    assert set_.engine_memory_share(local_world_size=8, on_cuda=True, environ={}) == 0.3
    # CPU: the ranks of a host share its memory
    assert unset.engine_memory_share(local_world_size=4, on_cuda=False, environ={}) == 0.125
    assert set_.engine_memory_share(local_world_size=3, on_cuda=False, environ={}) == 0.3
    with pytest.raises(ConfigError, match=r"0.3 x 4 ranks on this host = 1.20 .* must be <= 1"):
        set_.engine_memory_share(local_world_size=4, on_cuda=False, environ={})
    kv_env = {"VLLM_CPU_KVCACHE_SPACE": "1"}
    with pytest.raises(ConfigError, match=r"0.3 would be ignored: VLLM_CPU_KVCACHE_SPACE=1 is set"):
        set_.engine_memory_share(local_world_size=2, on_cuda=False, environ=kv_env)
    assert set_.engine_memory_share(local_world_size=2, on_cuda=True, environ=kv_env) == 0.3


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"advantage_estimator": "ppo2"}, r"advantage_estimator 'ppo2' is unknown; choose one of"),
        (
            {"critic_pretrain": "c"},
            r"critic_pretrain configures the critic, but advantage_estimator 'group_norm' trains "
            r"none: critic settings need a value-based estimator \(gae\)",
        ),
        ({"critic_learning_rate": 1e-5}, r"critic_learning_rate configures the critic"),
        ({"advantage_estimator": "rloo", "value_clip": 0.1}, r"value_clip configures the critic"),
        (
            {"advantage_estimator": "reinforce", "lambd": 0.9},
            r"lambd is read only by the advantage estimators gae; advantage_estimator "
            r"'reinforce' does not use it",
        ),
        ({"gamma": 0.9}, r"gamma is read only by .*gae.*; advantage_estimator 'group_norm' does"),
        ({"advantage_estimator": "gae", "lambd": 1.5}, r"lambd must be in \[0, 1\], got 1.5"),
        ({"advantage_estimator": "gae", "value_clip": -1.0}, r"value_clip must be >= 0, got -1.0"),
        (
            {"advantage_estimator": "gae", "critic_learning_rate": 0.0},
            r"critic_learning_rate must be > 0, got 0.0",
        ),
        ({"n_samples_per_prompt": 1, "train_batch_size": 32}, r"n_samples_per_prompt must be >= 2"),
        ({"use_kl_loss": True}, r"use_kl_loss needs init_kl_coef > 0"),
        ({"adam_offload": True, "fsdp_cpu_offload": True}, r"choose one"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\], got 0.0"),
        ({"rollout_batch_size": 0}, r"rollout_batch_size must be a positive integer, got 0"),
        ({"pretrain": "m"}, r"pretrain needs prompt_data"),
        ({"kl_estimator": "k9"}, r"kl_estimator 'k9' is unknown"),
        ({"zero_stage": 4}, r"zero_stage must be 1, 2 or 3 .*got 4"),
        ({"zero_stage": 3, "fsdp_cpu_offload": True}, r"fsdp_cpu_offload is an FSDP2 setting"),
        (
            {"zero_stage": 2, "fsdp_reshard_after_forward": False},
            r"fsdp_reshard_after_forward is an FSDP2 setting, but zero_stage=2",
        ),
        (
            {"zero_stage": 3, "fsdp_defer_gradient_sync": True},
            r"fsdp_defer_gradient_sync is an FSDP2 setting, but zero_stage=3",
        ),
        (
            {"fsdp_defer_gradient_sync": True, "fsdp_cpu_offload": True},
            r"fsdp_defer_gradient_sync keeps unreduced gradients .* choose one",
        ),
        ({"deepspeed_config": "ds.json"}, r"deepspeed_config 'ds.json' needs zero_stage"),
        ({"hf_decode": "fast"}, r"hf_decode 'fast' is unknown; choose one of \['auto'"),
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


def test_gae_trains_a_critic_with_lightrft_defaults_and_the_demo_tunes_its_rate() -> None:
    gae = TrainConfig(advantage_estimator="gae")
    assert gae.uses_critic
    assert not TrainConfig().uses_critic
    assert (gae.advantage_params.gamma, gae.advantage_params.lambd) == (1.0, 0.95)
    assert (gae.critic_lr, gae.value_clip_range) == (9e-6, 0.2)
    assert TrainConfig(advantage_estimator="gae", value_clip=0.0).value_clip_range is None
    custom = TrainConfig(
        advantage_estimator="gae", gamma=0.9, lambd=0.5, critic_learning_rate=1e-4, value_clip=0.3
    )
    assert (custom.advantage_params.gamma, custom.advantage_params.lambd) == (0.9, 0.5)
    assert (custom.critic_lr, custom.value_clip_range) == (1e-4, 0.3)
    assert TrainConfig(advantage_estimator="reinforce", gamma=0.5).advantage_params.gamma == 0.5
    demo = config_from_args(["train", "--advantage_estimator=gae"])
    assert demo.critic_learning_rate == DEMO_CRITIC_SETTINGS["critic_learning_rate"]
    assert config_from_args(["train"]).critic_learning_rate is None  # group_norm: no critic
    chosen = config_from_args(["train", "--advantage_estimator=gae", "--critic_learning_rate=2e-3"])
    assert chosen.critic_learning_rate == 2e-3


def test_tensorboard_missing_is_refused_before_starting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("lrft.config.fields.tensorboard_available", lambda: False)
    with pytest.raises(ConfigError, match=r"use_tensorboard .* pip install 'lrft\[plots\]'"):
        TrainConfig(use_tensorboard=True)
    assert main([*MODEL, "--use_tensorboard"]) == 2
    assert "pip install 'lrft[plots]'" in capsys.readouterr().err
    assert config_from_args(["train"]).use_tensorboard is False  # the demo runs without it


def test_tensorboard_is_on_for_the_demo_when_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("lrft.config.fields.tensorboard_available", lambda: True)
    assert config_from_args(["train"]).use_tensorboard is True
    assert config_from_args(["train", "--no-use_tensorboard"]).use_tensorboard is False
    assert config_from_args(MODEL).use_tensorboard is False
    assert config_from_args([*MODEL, "--use_tensorboard"]).use_tensorboard is True


def _non_default(name: str) -> list[str]:
    """A command line that sets ``name`` to something other than its default (still valid)."""
    special = {
        "use_kl_loss": ["--use_kl_loss", "--init_kl_coef=0.1"],
        # vllm's presence is patched in by the test (the main environment has none)
        "engine_type": ["--engine_type=vllm"],
        "engine_tp_size": ["--engine_type=vllm", "--engine_tp_size=2"],
        "engine_mem_util": ["--engine_type=vllm", "--engine_mem_util=0.3"],
        "hf_decode": ["--hf_decode=static"],
        "kl_estimator": ["--kl_estimator=k1"],
        "advantage_estimator": ["--advantage_estimator=rloo"],
        "train_batch_size": ["--train_batch_size=64"],
        "micro_train_batch_size": ["--micro_train_batch_size=8"],
        "rollout_batch_size": ["--rollout_batch_size=16"],
        "n_samples_per_prompt": ["--n_samples_per_prompt=4"],
        "top_p": ["--top_p=0.5"],
        "reward_fn": ["--reward_fn=a:b"],
        "max_steps": ["--max_steps=2"],
        "save_hf_model": ["--no-save_hf_model"],
        "zero_stage": ["--zero_stage=3"],
        "deepspeed_config": ["--zero_stage=3", "--deepspeed_config=ds.json"],
        # the default depends on the preset; without tensorboard the flag is an error (tested)
        "use_tensorboard": ["--use_tensorboard"] if tensorboard_available() else [],
        "policy_loss_type": ["--policy_loss_type=gspo"],
        "eps_clip_low_high": ["--eps_clip_low_high", "0.1", "0.3"],
        "dual_clip": ["--dual_clip=3"],
        "loss_agg_mode": ["--loss_agg_mode=seq-mean-token-sum"],
        "tis_cap": ["--use_tis", "--tis_cap=3"],
        "overlong_penalty_factor": ["--overlong_buffer_len=4", "--overlong_penalty_factor=0.5"],
        "fire_first_token_temperature": ["--use_fire_sampling", "--fire_first_token_temperature=5"],
        "max_num_gen_batches": ["--dynamic_sampling", "--max_num_gen_batches=2"],
        # critic settings and lambd need gae, gamma an estimator that discounts (tested above)
        "gamma": ["--advantage_estimator=reinforce", "--gamma=0.5"],
        "lambd": ["--advantage_estimator=gae", "--lambd=0.5"],
        "critic_pretrain": ["--advantage_estimator=gae", "--critic_pretrain=x"],
        "critic_learning_rate": ["--advantage_estimator=gae", "--critic_learning_rate=0.5"],
        "value_clip": ["--advantage_estimator=gae", "--value_clip=0.5"],
        # where the W&B run goes needs --use_wandb, which needs wandb (both tested elsewhere)
        **{
            name: ["--use_wandb", f"--{name}=x"] if wandb_available() else []
            for name in WANDB_SETTINGS
        },
        "use_wandb": ["--use_wandb"] if wandb_available() else [],
        "save_trajectories_steps": ["--save_trajectories", "--save_trajectories_steps=7"],
        "preset": ["--preset=smollm2"],
        "cache_dir": ["--preset=smollm2", "--cache_dir=x"],
        "remote_rm_url": ["--remote_rm_url=http://127.0.0.1:9/score"],
        "remote_rm_timeout_s": ["--remote_rm_url=http://127.0.0.1:9/x", "--remote_rm_timeout_s=2"],
        "remote_rm_max_attempts": [
            "--remote_rm_url=http://127.0.0.1:9/x",
            "--remote_rm_max_attempts=7",
        ],
        "remote_rm_protocol": [
            "--remote_rm_url=http://127.0.0.1:9/x",
            "--remote_rm_protocol=openrlhf",
        ],
        "remote_rm_batch_size": [
            "--remote_rm_url=http://127.0.0.1:9/x",
            "--remote_rm_batch_size=128",
        ],
        "remote_rm_max_concurrency": [
            "--remote_rm_url=http://127.0.0.1:9/x",
            "--remote_rm_max_concurrency=4",
        ],
        "remote_rm_auth_env": [
            "--remote_rm_url=http://127.0.0.1:9/x",
            "--remote_rm_auth_env=RM_TOKEN",
        ],
        "reward_weights": ["--reward_weights=0.5"],
        # media: the demo switch needs no model (tested in test_media_config.py), images need
        # the chat template
        "demo": [],
        "images_key": ["--images_key=x", "--apply_chat_template"],
        "limit_mm_image_per_prompt": [
            "--images_key=x",
            "--apply_chat_template",
            "--limit_mm_image_per_prompt=3",
        ],
        "audios_key": ["--audios_key=x", "--apply_chat_template"],
        "limit_mm_audio_per_prompt": [
            "--audios_key=x",
            "--apply_chat_template",
            "--limit_mm_audio_per_prompt=3",
        ],
        # the judges' settings need judges; recipes replace the weights (tested elsewhere)
        "grm_pretrain": ["--grm_pretrain=judge"],
        **{
            name: ["--grm_pretrain=judge", *value]
            for name, value in {
                "grm_template": ["--grm_template=pointwise-score-tag"],
                "grm_max_new_tokens": ["--grm_max_new_tokens=7"],
                "grm_apply_chat_template": ["--grm_apply_chat_template"],
                "grm_unparsable_score": ["--grm_unparsable_score=-1"],
            }.items()
        },
        "reward_recipes": ["--reward_recipes=recipes.json"],
        # the adapters' settings need adapters
        "lora_alpha": ["--lora_rank=8", "--lora_alpha=8"],
        "lora_dropout": ["--lora_rank=8", "--lora_dropout=0.1"],
        "target_modules": ["--lora_rank=8", "--target_modules", "q_proj", "v_proj"],
        **KNOB_VALUES,
        # the episode settings need an environment
        "environment": ["--environment=tool_calls"],
        "environment_options": [
            "--environment=tool_calls",
            '--environment_options={"chat_template": false}',
        ],
        "tools": ["--environment=tool_calls", "--tools", "calculator", "python"],
        "max_turns": ["--environment=tool_calls", "--max_turns=7"],
        "max_episode_tokens": ["--environment=tool_calls", "--max_episode_tokens=77"],
        # on by default only with max_staleness >= 1 (a computed default)
        "use_tis": ["--use_tis"],
        # a split placement needs its rollout ranks and the broadcast sync
        **{
            name: ["--placement=split", "--weight_sync=broadcast", *value]
            for name, value in {
                "placement": ["--rollout_world_size=1"],
                "rollout_world_size": ["--rollout_world_size=2"],
                "max_staleness": ["--rollout_world_size=1", "--max_staleness=1"],
            }.items()
        },
        # sequence parallelism splits packed rows
        "sequence_parallel_size": ["--packing_samples", "--sequence_parallel_size=2"],
        # a distillation estimator has a teacher; the service's settings need the service; the
        # process reward model and its separator go together
        **{
            name: ["--advantage_estimator=on_policy_distillation", *value]
            for name, value in {
                "teacher_pretrain": ["--teacher_pretrain=t"],
                "opd_kl_coef": ["--teacher_pretrain=t", "--opd_kl_coef=0.5"],
                "no_task_reward": ["--teacher_pretrain=t", "--no_task_reward"],
                "teacher_url": [TEACHER_URL],
                "teacher_protocol": [TEACHER_URL, "--teacher_protocol=sglang"],
                "teacher_auth_env": [TEACHER_URL, "--teacher_auth_env=TEACHER_TOKEN"],
                "teacher_timeout_s": [TEACHER_URL, "--teacher_timeout_s=5"],
                "teacher_max_attempts": [TEACHER_URL, "--teacher_max_attempts=2"],
            }.items()
        },
        "prm_pretrain": ["--prm_pretrain=prm", "--prm_step_separator=;"],
        "prm_step_separator": ["--prm_pretrain=prm", "--prm_step_separator=;"],
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


TEACHER_URL = "--teacher_url=http://127.0.0.1:9/teacher"


def test_every_flag_changes_its_config_field(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each flag, given another value, changes its TrainConfig field. That it then changes what
    the run does is test_flag_effects.py's (a short run recorded with and without it)."""
    pretend_installed(monkeypatch, vllm=True)
    baseline = config_from_args(MODEL)
    for flag in FLAGS:
        argv = _non_default(flag.name)
        if not argv:
            continue
        changed = config_from_args([*MODEL, *argv])
        assert getattr(changed, flag.name) != getattr(baseline, flag.name), flag.name


def test_engine_type_choices_are_the_registered_engines() -> None:
    flag = next(f for f in FLAGS if f.name == "engine_type")
    assert callable(flag.choices)
    assert set(flag.choices()) == set(registry.entries("rollout")) >= {"hf", "vllm"}


def test_hf_decode_is_refused_with_another_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    pretend_installed(monkeypatch, vllm=True)
    with pytest.raises(ConfigError, match=r"hf_decode 'static' picks the hf engine's .* 'vllm'"):
        TrainConfig(engine_type="vllm", hf_decode="static")


def test_hf_decode_paths_are_the_engines() -> None:
    from lrft.backends.rollout.hf import DECODE_PATHS

    assert DECODE_PATHS == HF_DECODE_PATHS
