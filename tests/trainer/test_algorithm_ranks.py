"""The algorithm flags together on two gloo ranks: one iteration with GSPO, TIS, FIRE, entropy,
overlong shaping and dynamic sampling, whose refill rounds move the sampler on every rank alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lrft.cli import config_from_args
from lrft.testing.distributed import DistributedSuite, RankPool, current_rank_context
from lrft.trainer.build import build_trainer
from tests.trainer.fixtures import base_args, make_model_folder, make_prompt_files, rank_info

FLAGS = [
    "--reward_fn=tests.trainer.fixtures:exact",  # a random model scores 0: groups get dropped
    "--policy_loss_type=gspo",
    "--use_tis",
    "--use_fire_sampling",
    "--fire_first_token_temperature=2",
    "--entropy_loss_coef=0.01",
    "--overlong_buffer_len=2",
    "--dynamic_sampling",
    "--max_num_gen_batches=2",
    "--enable_engine_sleep",
]


def _one_step(root: Path) -> dict[str, Any]:
    context = current_rank_context()
    if context.rank == 0 and not (root / "model").exists():
        make_model_folder(root / "model")
        make_prompt_files(root / "data")
    torch.distributed.barrier()
    args = base_args(
        root / "model", root / "data/train.jsonl", root / "data/eval.jsonl", root / "out"
    )
    config = config_from_args([*args, *FLAGS])
    info = rank_info()
    trainer = build_trainer(config, info)
    trainer.colocation.sync(version=0)
    metrics = trainer.train_step()
    batch = next(trainer.buffer.micro_batches(len(trainer.buffer), epoch=0))
    return {
        "metrics": metrics,
        "sampler": trainer.sampler.state_dict(),
        "rows": len(trainer.buffer),
        "engine_logprobs": batch.engine_logprobs is not None,
        "version": trainer.engine.weights_version,
    }


class TestAlgorithmFlagsRanks(DistributedSuite):
    world_size = 2

    def test_one_iteration_with_every_algorithm_flag(self, pool: RankPool, tmp_path: Path) -> None:
        root = pool.shared_dir / tmp_path.name
        outcomes = pool.run(_one_step, root)
        first, second = outcomes
        metrics = first["metrics"]
        assert metrics == second["metrics"]  # rank-averaged, and the counts are global sums
        rounds = metrics["dynamic_sampling/rounds"]
        assert rounds in (1.0, 2.0)
        # every round took a global batch of 4 prompts, on both ranks alike
        assert metrics["dynamic_sampling/generated_groups"] == 4 * rounds
        assert first["sampler"]["consumed_samples"] == second["sampler"]["consumed_samples"]
        assert first["sampler"]["consumed_samples"] == 4 * rounds
        kept = (
            metrics["dynamic_sampling/generated_groups"]
            - metrics["dynamic_sampling/dropped_groups"]
        )
        assert metrics["dynamic_sampling/padded_groups"] == max(4 - kept, 0)
        for outcome in outcomes:
            assert outcome["rows"] == 8  # 2 prompts x 4 samples per rank, refilled or padded
            assert outcome["engine_logprobs"]
            assert outcome["version"] == 1
        assert "policy/entropy" in metrics
        assert "policy/is_weight_mean" in metrics
        assert metrics["reward/overlong_penalty"] <= 0.0
