"""Several reward models colocated on one GPU: two scalar RMs (FSDP2, offloaded outside their
call) and a generative judge (an hf engine asleep at level 1 outside its call), built by the
trainer's ``build_reward``. The test states the device memory each phase holds: idle (every model
parked on the host), and each model's own call, measured from inside it (a forward pre-hook on
the model's root, after its reload or wake), and the peak of each call. Each call holds about its
own model's bytes, never another's.

Sizes: reward_model_0 ~91 M parameters (fp32, ~350 MiB), reward_model_1 ~47 M (~180 MiB), the
judge ~69 M in bf16 (~130 MiB), so any model left resident would show plainly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification

from lrft.backends.train.fsdp2 import FSDP2Backend
from lrft.config import TrainConfig
from lrft.demos.tokenizer import EOS_ID, PAD_ID, VOCAB_SIZE, build_tokenizer
from lrft.rewards import CombinedReward, RewardSample, compute_rewards
from lrft.testing.distributed import DistributedSuite, RankPool, current_rank_context
from lrft.trainer.judges import ColocatedJudge
from lrft.trainer.rewards import ColocatedRewardModel, build_reward

MIB = 2**20
pytestmark = pytest.mark.gpu


def _config(layers: int) -> Qwen2Config:
    config = Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_key_value_heads=4,
        max_position_embeddings=512,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        bos_token_id=None,
    )
    config.num_labels = 1
    return config


def _save(model: torch.nn.Module, folder: Path) -> Path:
    model.save_pretrained(folder)  # type: ignore[operator]  # a transformers model
    build_tokenizer().save_pretrained(folder)
    return folder


def _inputs(root: Path) -> None:
    if not (root / "judge").exists():
        torch.manual_seed(0)
        _save(Qwen2ForSequenceClassification(_config(8)), root / "rm0")  # type: ignore[no-untyped-call]  # unannotated in transformers
        _save(Qwen2ForSequenceClassification(_config(4)), root / "rm1")  # type: ignore[no-untyped-call]  # unannotated in transformers
        _save(Qwen2ForCausalLM(_config(6)), root / "judge")


def _bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def phases(root: Path) -> dict[str, Any]:
    _inputs(root)
    device = current_rank_context().device
    config = TrainConfig(
        pretrain="unused",
        prompt_data="unused",
        reward_pretrain=[str(root / "rm0"), str(root / "rm1")],
        grm_pretrain=[str(root / "judge")],
        grm_max_new_tokens=16,
        enable_engine_sleep=True,
        micro_rollout_batch_size=4,
        n_samples_per_prompt=2,
        train_batch_size=64,  # the 32 prompts x 2 samples of one iteration
        hf_decode="generate",  # the judge's forwards run as module calls, which the hooks see
    )
    torch.cuda.synchronize(device)
    start = torch.cuda.memory_allocated(device)
    reward = build_reward(config, FSDP2Backend(), [""])
    assert isinstance(reward, CombinedReward)
    parts = {part.reward.name: part.reward for part in reward.routes[""]}
    models: dict[str, torch.nn.Module] = {}
    for name in ("reward_model_0", "reward_model_1"):
        part = parts[name]
        assert isinstance(part, ColocatedRewardModel)
        models[name] = part.model.module
    judge = parts["grm"]
    assert isinstance(judge, ColocatedJudge)
    models["grm"] = judge.reward.engine.model  # type: ignore[attr-defined]  # the hf engine's
    sizes = {
        "reward_model_0": _bytes(models["reward_model_0"]),  # FSDP2 on one rank: the whole model
        "reward_model_1": _bytes(models["reward_model_1"]),
    }
    resident: dict[str, int] = {}

    def record(name: str) -> None:
        torch.cuda.synchronize(device)
        resident.setdefault(name, torch.cuda.memory_allocated(device))

    for name, module in models.items():
        module.register_forward_pre_hook(lambda *_, name=name: record(name))
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    idle = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    samples = [RewardSample(prompt=f"{a}+{a}=", response=str(2 * a)) for a in range(8)]
    compute_rewards(reward, samples)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    after = torch.cuda.memory_allocated(device)
    judge.reward.engine.wake()
    sizes["grm"] = _bytes(models["grm"])  # bf16 weights, resident while awake
    judge.reward.engine.sleep(1)
    return {
        "idle_mib": (idle - start) / MIB,
        "after_mib": (after - start) / MIB,
        "peak_mib": (peak - start) / MIB,
        "model_mib": {name: size / MIB for name, size in sizes.items()},
        "phase_mib": {name: (value - idle) / MIB for name, value in resident.items()},
    }


class TestRewardModelsOnOneGPU(DistributedSuite):
    world_size = 1
    device_type = "cuda"

    def test_each_phase_holds_only_its_own_model(self, pool: RankPool, tmp_path: Path) -> None:
        (figures,) = pool.run(phases, pool.shared_dir / tmp_path.name)
        print(f"\nreward-phase device memory (MiB): {figures}")
        models, held = figures["model_mib"], figures["phase_mib"]
        assert set(held) == {"reward_model_0", "reward_model_1", "grm"}
        smallest = min(models.values())
        # idle: every model on the host (what stays is the CUDA context's buffers, a few MiB)
        assert figures["idle_mib"] < 0.1 * smallest, figures
        assert figures["after_mib"] - figures["idle_mib"] < 0.1 * smallest, figures
        for name, size in models.items():
            other = min(s for n, s in models.items() if n != name)
            # its own model is resident in its call, and no other model: the smallest other one
            # left resident would add at least 130 MiB
            assert held[name] >= 0.95 * size, (name, figures)
            assert held[name] < size + 0.5 * other, (name, figures)
        assert figures["peak_mib"] < sum(models.values()), figures  # never all at once
