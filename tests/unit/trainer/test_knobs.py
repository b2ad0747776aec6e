"""The knobs LightRFT users reach for, checked without a process group: the learning-rate
schedule and AdamW's betas, adaptive KL, reward and advantage clipping, checkpoint folders,
the rules of each, and the batch reward functions of LightRFT's signature."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

from lrft.algo import AdaptiveKLController, FixedKLController
from lrft.api.errors import ConfigError
from lrft.api.types import GenerationResult, SamplingParams
from lrft.config import TrainConfig
from lrft.rewards import RewardSample, compute_rewards
from lrft.rewards.batch_function import BatchFunctionReward, batch_parameters
from lrft.run import checkpoint as ckpt
from lrft.run.resume import check_schedule, checkpoint_to_resume
from lrft.trainer.experience import ExperienceMaker
from lrft.trainer.rewards import load_reward
from lrft.trainer.sequences import pack

MODEL: dict[str, Any] = {"pretrain": "m", "prompt_data": "p.jsonl", "reward_fn": "math"}


def test_the_default_response_length_serves_real_models_and_the_demo_keeps_its_own() -> None:
    from lrft.cli import config_from_args

    assert TrainConfig().generate_max_len == 1024  # LightRFT's
    assert config_from_args(["train"]).generate_max_len == 5


@pytest.mark.parametrize(
    ("kind", "ratio", "floor", "iterations"),
    [("cosine", 0.1, None, 10), ("linear", 0.0, 0.2, 6), ("cosine_with_min_lr", 0.03, None, 40)],
)
def test_the_schedule_warms_up_then_decays_to_its_floor(
    kind: str, ratio: float, floor: float | None, iterations: int
) -> None:
    # 32 prompts x 8 samples per iteration, 128 per optimizer step: 2 steps per iteration
    config = TrainConfig(lr_scheduler=kind, lr_warmup_ratio=ratio, min_lr_ratio=floor)
    schedule = config.scheduler_config(iterations)
    total = 2 * iterations
    warmup = math.ceil(total * ratio)
    assert (schedule.total_steps, schedule.warmup_steps) == (total, warmup)
    low = {"cosine": 0.0, "linear": 0.2, "cosine_with_min_lr": 0.1}[kind]
    for step in range(total):
        if step < warmup:
            expected = (step + 1) / (warmup + 1)
        else:
            progress = (step - warmup) / (total - warmup)
            decay = 1 - progress if kind == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
            expected = low + (1 - low) * decay
        assert schedule.multiplier(step) == pytest.approx(expected)


def test_a_constant_rate_may_warm_up_and_takes_no_floor() -> None:
    schedule = TrainConfig(lr_warmup_ratio=0.5).scheduler_config(2)  # 2 of 4 steps
    assert [schedule.multiplier(s) for s in range(4)] == pytest.approx([1 / 3, 2 / 3, 1.0, 1.0])
    with pytest.raises(ConfigError, match=r"min_lr_ratio 0.1 is the floor .* 'constant'"):
        TrainConfig(min_lr_ratio=0.1)


def test_a_decay_with_no_step_left_after_its_warm_up_is_refused() -> None:
    config = TrainConfig(lr_scheduler="cosine", lr_warmup_ratio=0.9)
    with pytest.raises(ConfigError, match=r"decays over the run's 2 optimizer steps after 2"):
        config.scheduler_config(1)


def test_the_optimizer_reads_the_betas_decay_and_clip() -> None:
    config = TrainConfig(adam_betas=[0.8, 0.95], l2=0.1, max_norm=0.5)  # a config file's list
    optimizer = config.optimizer_config(3e-4)
    assert (optimizer.lr, optimizer.betas) == (3e-4, (0.8, 0.95))
    assert (optimizer.weight_decay, optimizer.max_grad_norm) == (0.1, 0.5)
    with pytest.raises(ConfigError, match=r"adam_betas must each be in \[0, 1\), got \(0.9, 1.0\)"):
        TrainConfig(adam_betas=(0.9, 1.0))


def test_the_kl_coefficient_is_fixed_or_adapts_towards_its_target() -> None:
    assert TrainConfig(init_kl_coef=0.1).kl_controller() == FixedKLController(value=0.1)
    adaptive = TrainConfig(init_kl_coef=0.1, kl_target=0.05).kl_controller()
    assert adaptive == AdaptiveKLController(value=0.1, target=0.05, horizon=10_000)
    horizon = TrainConfig(init_kl_coef=0.1, kl_target=0.05, kl_horizon=512).kl_controller()
    assert isinstance(horizon, AdaptiveKLController)
    assert horizon.horizon == 512


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"kl_horizon": 100},
            r"kl_horizon 100 is the adaptive KL controller's; it needs kl_target",
        ),
        ({"kl_target": 0.1}, r"kl_target 0.1 adapts .* set init_kl_coef > 0"),
        (
            {"kl_target": 0.1, "init_kl_coef": 0.1, "kl_horizon": 100},
            r"kl_horizon 100 must be >= the 256 samples of one iteration",
        ),
        ({"reward_clip": -1.0}, r"reward_clip must be >= 0, got -1.0"),
        ({"lr_warmup_ratio": 1.0}, r"lr_warmup_ratio must be in \[0, 1\)"),
        ({"lr_scheduler": "step"}, r"lr_scheduler 'step' is unknown; choose one of constant"),
        ({"system_prompt": "be brief"}, r"system_prompt needs apply_chat_template"),
        (
            {**MODEL, "prompt_data_probs": (0.5, 0.5)},
            r"prompt_data_probs weights several .* but 1 is given",
        ),
        (
            {**MODEL, "prompt_data": "a.jsonl,b.jsonl", "prompt_data_probs": (1.0,)},
            r"prompt_data_probs has 1 entries for 2 prompt_data sources",
        ),
        (
            {**MODEL, "prompt_data": "a.jsonl,b.jsonl", "prompt_data_probs": (0.5, 0.6)},
            r"prompt_data_probs .* must sum to 1, got 1.1",
        ),
        ({"prompt_split": "train"}, r"prompt_split 'train' picks a split of prompt_data"),
        ({"eval_split": "test"}, r"eval_split 'test' picks a split of eval_dataset, or of"),
        ({**MODEL, "eval_split": "train"}, r"eval_split 'train' is the split training reads"),
        (
            {**MODEL, "prompt_data": "a.jsonl,b.jsonl", "eval_split": "test"},
            r"names 2 sources: give eval_dataset",
        ),
        ({"attn_implementation": "flash"}, r"attn_implementation 'flash' is unknown"),
        (
            {"train_backend": "fsdp2", "zero_stage": 3},
            r"'fsdp2' \(LightRFT's --fsdp\) .* zero_stage 3",
        ),
        ({"train_backend": "deepspeed"}, r"train_backend 'deepspeed' needs zero_stage"),
        (
            {"train_backend": "megatron"},
            r"train_backend 'megatron' is unknown; known: .*deepspeed, fsdp2",
        ),
        (
            {"weight_sync": "nccl"},
            r"weight_sync 'nccl' is unknown; known: .*direct.*'lrft.weight_syncs'",
        ),
        ({"engine_type": "sglang"}, r"engine_type 'sglang' is unknown; known: .*hf.*vllm"),
        ({"plugins": "not a module"}, r"plugins entry 'not a module' is not a Python module name"),
        (
            {"ckpt_path": "out/checkpoints/global_step4"},
            r"names one checkpoint, which only a resume",
        ),
    ],
)
def test_knob_rules_name_the_value_and_the_rule(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**changes)  # type: ignore[arg-type]


def test_flash_attention_needs_its_package_and_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"needs the flash-attn package.* sdpa kernel"):
        TrainConfig(attn_implementation="flash_attention_2")
    monkeypatch.setattr("importlib.util.find_spec", lambda name: object())
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"runs on CUDA only"):
        TrainConfig(attn_implementation="flash_attention_2")


def test_a_package_backend_takes_none_of_lrfts_backend_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("lrft.backends.registry.is_known", lambda kind, name: True)
    assert TrainConfig(train_backend="theirs").train_backend_name == "theirs"
    with pytest.raises(ConfigError, match=r"fsdp_cpu_offload is a setting of lrft's own"):
        TrainConfig(train_backend="theirs", fsdp_cpu_offload=True)
    assert TrainConfig(zero_stage=2).train_backend_name == "deepspeed"
    assert TrainConfig().train_backend_name == "fsdp2"


def _maker(**clips: float) -> ExperienceMaker:
    return ExperienceMaker(
        engine=None,  # make() never touches the engine
        decode=str,
        reward=None,  # nor the reward
        sampling=SamplingParams(n=2),
        estimator="reinforce",
        micro_batch_size=2,
        device=torch.device("cpu"),
        **clips,  # type: ignore[arg-type]  # float fields only
    )


def _sequences() -> object:
    return pack(
        [
            GenerationResult(
                request_id=str(i),
                sample_index=i % 2,
                prompt_token_ids=[1, 2],
                output_token_ids=[3, 4, 5],
                finish_reason="stop",
            )
            for i in range(4)
        ]
    )


def test_rewards_and_advantages_are_clipped_to_their_bounds() -> None:
    scores = torch.tensor([5.0, -4.0, 0.5, -0.25])
    plain = _maker().make(_sequences(), scores, None, None)  # type: ignore[arg-type]
    clipped = _maker(reward_clip=1.0).make(_sequences(), scores, None, None)  # type: ignore[arg-type]
    # reinforce, gamma 1: each token's advantage is the sequence's (clipped) reward
    assert plain.advantages[:, 0].tolist() == scores.tolist()
    assert clipped.advantages[:, 0].tolist() == [1.0, -1.0, 0.5, -0.25]
    assert clipped.scores.tolist() == scores.tolist()  # what the reward said stays on record
    bounded = _maker(advantage_clip=0.3).make(_sequences(), scores, None, None)  # type: ignore[arg-type]
    assert bounded.advantages[:, 0].tolist() == pytest.approx([0.3, -0.3, 0.3, -0.25])


def lightrft_reward(responses: list[str], labels: list[str]) -> list[float]:
    """LightRFT's custom reward signature: lists in, one score per response out."""
    return [
        float(len(r)) + (10.0 if label == "long" else 0.0)
        for r, label in zip(responses, labels, strict=True)
    ]


def with_metrics(
    queries: list[str], refs: list[str | None]
) -> tuple[torch.Tensor, dict[str, list[float]]]:
    scores = torch.tensor(
        [float(ref is not None and q.endswith(ref)) for q, ref in zip(queries, refs, strict=True)]
    )
    return scores, {"matched": scores.tolist()}


def test_reward_functions_of_lightrfts_signature_get_whole_batches() -> None:
    samples = [
        RewardSample(prompt="1+1=", response="2", label="short", reference="2"),
        RewardSample(prompt="9+9=", response="19", label="long", reference="18"),
    ]
    reward = load_reward(f"{__name__}:lightrft_reward", reference_key=None)
    assert isinstance(reward, BatchFunctionReward)
    assert compute_rewards(reward, samples).scores == (1.0, 12.0)
    output = compute_rewards(load_reward(f"{__name__}:with_metrics", None), samples)
    assert (output.scores, output.metrics["matched"]) == ((1.0, 0.0), (1.0, 0.0))
    # a function of one sample keeps lrft's per-sample form
    assert batch_parameters(lambda sample: 1.0) is None
    assert batch_parameters(lambda responses, extra: 1.0) is None  # 'extra' cannot be given


def _checkpoint(root: Path, step: int) -> Path:
    folder = root / f"global_step{step}"
    folder.mkdir(parents=True)
    (folder / ckpt.MANIFEST).write_text("{}")
    return folder


def test_ckpt_path_names_the_checkpoints_folder_or_one_checkpoint(tmp_path: Path) -> None:
    root = tmp_path / "ckpts"
    _checkpoint(root, 2)
    _checkpoint(root, 4)
    folder = TrainConfig(**MODEL, ckpt_path=str(root), load_checkpoint=True)
    assert checkpoint_to_resume(folder) == root / "global_step4"
    named = TrainConfig(**MODEL, ckpt_path=str(root / "global_step4"), load_checkpoint=True)
    assert (named.checkpoint_dir, named.resume_from) == (str(root), str(root / "global_step4"))
    assert checkpoint_to_resume(named) == root / "global_step4"
    # an earlier one would see the resumed run write over the later ones as it reaches them
    earlier = TrainConfig(**MODEL, ckpt_path=str(root / "global_step2"), load_checkpoint=True)
    with pytest.raises(ConfigError, match=r"names step 2, but .* later checkpoints at steps \[4\]"):
        checkpoint_to_resume(earlier)
    (root / "elsewhere").mkdir()
    (root / "global_step2").rename(root / "elsewhere" / "global_step2")
    moved = root / "elsewhere" / "global_step2"
    branch = TrainConfig(**MODEL, ckpt_path=str(moved), load_checkpoint=True)
    assert checkpoint_to_resume(branch) == moved
    missing = TrainConfig(**MODEL, ckpt_path=str(root / "global_step3"), load_checkpoint=True)
    with pytest.raises(ConfigError, match=r"not a complete lrft checkpoint .* at steps \[4\]"):
        checkpoint_to_resume(missing)


def test_a_given_ckpt_path_without_a_checkpoint_is_refused_not_started_from_zero(
    tmp_path: Path,
) -> None:
    lightrft = tmp_path / "episode_5"
    (lightrft / "_actor").mkdir(parents=True)
    config = TrainConfig(**MODEL, ckpt_path=str(lightrft), load_checkpoint=True)
    with pytest.raises(ConfigError, match=r"holds no complete lrft checkpoint .* _actor/"):
        checkpoint_to_resume(config)
    # without --ckpt_path a first run of a resumable job starts from step 0
    fresh = TrainConfig(**MODEL, save_path=str(tmp_path / "out"), load_checkpoint=True)
    assert checkpoint_to_resume(fresh) is None


def test_a_resume_that_would_bend_the_schedule_is_refused(tmp_path: Path) -> None:
    config = TrainConfig(lr_scheduler="cosine", lr_warmup_ratio=0.25)
    saved = attrs.asdict(config.scheduler_config(4))  # as the checkpoint's manifest holds it
    check_schedule(saved, attrs.asdict(config.scheduler_config(4)), tmp_path)
    check_schedule(None, attrs.asdict(config.scheduler_config(6)), tmp_path)  # recorded none
    longer = attrs.asdict(config.scheduler_config(6))
    with pytest.raises(ConfigError, match=r"learning-rate schedule .* resume with the checkpoint"):
        check_schedule(saved, longer, tmp_path)
    # a constant rate without warm-up is the same schedule whatever the length
    constant = TrainConfig()
    check_schedule(
        attrs.asdict(constant.scheduler_config(4)),
        attrs.asdict(constant.scheduler_config(6)),
        tmp_path,
    )
