"""The optimizer and algorithm knobs in a real trainer (one gloo rank, three iterations): the
learning rate of every optimizer step follows warm-up then cosine decay to its floor, AdamW runs
with the given betas, the adaptive KL coefficient moves as Ziegler et al. (2019)'s proportional
controller says, and an advantage estimator and a policy loss registered by a ``--plugins``
module are the ones the trainer calls."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from lrft.cli import config_from_args
from lrft.dist import RankInfo
from lrft.testing.distributed import DistributedSuite, RankPool, current_rank_context
from lrft.trainer.build import build_trainer
from tests.trainer.fixtures import base_args, make_model_folder, make_prompt_files

LR = 1e-3
ITERATIONS = 3
STEPS_PER_ITERATION = 2  # 4 prompts x 4 samples in optimizer steps of 8 (base_args)
WARMUP_RATIO, FLOOR = 0.2, 0.1
INIT_KL, KL_TARGET, KL_HORIZON = 0.05, 0.001, 64
SAMPLES = 16

FLAGS = [
    f"--max_steps={ITERATIONS}",
    "--save_steps=-1",
    "--lr_scheduler=cosine",
    f"--lr_warmup_ratio={WARMUP_RATIO}",
    f"--min_lr_ratio={FLOOR}",
    "--adam_betas",
    "0.8",
    "0.9",
    f"--init_kl_coef={INIT_KL}",
    f"--kl_target={KL_TARGET}",
    f"--kl_horizon={KL_HORIZON}",
    "--plugins=tests.unit._plugins.algorithms",
    "--advantage_estimator=top_baseline",
    "--policy_loss_type=ppo_counted",
]


def _train(root: Path) -> dict[str, Any]:
    from tests.unit._plugins.algorithms import CALLS

    context = current_rank_context()
    make_model_folder(root / "model")
    make_prompt_files(root / "data")
    args = base_args(
        root / "model", root / "data/train.jsonl", root / "data/eval.jsonl", root / "out"
    )
    config = config_from_args([*args, *FLAGS])
    info = RankInfo(rank=0, local_rank=0, world_size=1, local_world_size=1, device=context.device)
    trainer = build_trainer(config, info)
    trainer.colocation.sync(version=0)
    metrics = []
    for _ in range(ITERATIONS):
        metrics.append(trainer.train_step())
        trainer.colocation.sync(version=trainer.step)
    optimizer = trainer.actor.optimizer  # type: ignore[attr-defined]  # the fsdp2 handle's
    advantages = torch.cat([b.advantages for b in trainer.buffer.micro_batches(2, epoch=0)])
    return {
        "metrics": metrics,
        "betas": [group["betas"] for group in optimizer.param_groups],
        "coef_in_use": (trainer.maker.kl_coef, trainer.update.kl_coef),
        "calls": dict(CALLS),
        "max_advantage": float(advantages.max()),
    }


def _lr(step: int) -> float:
    """Warm-up then cosine to the floor, written out (steps counted from 0)."""
    total = ITERATIONS * STEPS_PER_ITERATION
    warmup = math.ceil(total * WARMUP_RATIO)
    if step < warmup:
        return LR * (step + 1) / (warmup + 1)
    progress = (step - warmup) / (total - warmup)
    return LR * (FLOOR + (1 - FLOOR) * 0.5 * (1 + math.cos(math.pi * progress)))


class TestKnobsRanks(DistributedSuite):
    world_size = 1

    def test_schedule_betas_adaptive_kl_and_plugin_algorithms(
        self, pool: RankPool, tmp_path: Path
    ) -> None:
        [outcome] = pool.run(_train, pool.shared_dir / tmp_path.name)
        metrics = outcome["metrics"]
        for i, record in enumerate(metrics):
            steps = range(i * STEPS_PER_ITERATION, (i + 1) * STEPS_PER_ITERATION)
            expected = sum(_lr(s) for s in steps) / STEPS_PER_ITERATION  # the iteration's mean
            assert math.isclose(record["policy/lr"], expected, rel_tol=1e-6), (i, record)
        assert outcome["betas"] == [(0.8, 0.9)] * len(outcome["betas"])
        # beta_{t+1} = beta_t * (1 + clip(KL_t / target - 1, -0.2, 0.2) * n / horizon)
        coef = INIT_KL
        for record in metrics:
            assert math.isclose(record["kl/coef"], coef, rel_tol=1e-9), record
            error = min(max(record["kl"] / KL_TARGET - 1, -0.2), 0.2)
            coef *= 1 + error * SAMPLES / KL_HORIZON
        assert coef != INIT_KL
        # the rewards' penalty and the loss use the updated coefficient next
        assert all(math.isclose(value, coef, rel_tol=1e-9) for value in outcome["coef_in_use"])
        # the plug-in estimator (s - best of its group) and loss ran, once per iteration / step
        assert outcome["calls"]["estimator"] == ITERATIONS
        assert outcome["calls"]["loss"] >= ITERATIONS * STEPS_PER_ITERATION
        assert outcome["max_advantage"] <= 0.0
