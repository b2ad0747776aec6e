"""The trainer on two gloo ranks (harness): phase order, and evaluation that changes nothing."""

from __future__ import annotations

from pathlib import Path

import attrs
import torch

from lrft.api.digest import tensor_digest
from lrft.cli import config_from_args
from lrft.dist import RankInfo
from lrft.testing.distributed import DistributedSuite, RankPool, current_rank_context
from lrft.trainer import PHASES
from lrft.trainer.build import build_trainer
from lrft.trainer.trainer import RLTrainer
from tests.trainer.fixtures import base_args, make_model_folder, make_prompt_files


def _trainer(root: Path, extra: list[str]) -> RLTrainer:
    context = current_rank_context()
    model = root / "model"
    if context.rank == 0 and not model.exists():
        make_model_folder(model)
        make_prompt_files(root / "data")
    torch.distributed.barrier()
    args = base_args(model, root / "data/train.jsonl", root / "data/eval.jsonl", root / "out")
    config = config_from_args([*args, *extra])
    info = RankInfo(
        rank=context.rank,
        local_rank=context.rank,
        world_size=context.world_size,
        local_world_size=context.world_size,
        device=context.device,
    )
    return build_trainer(config, info)


def _digests(trainer: RLTrainer) -> dict[str, str]:
    return {
        name: tensor_digest(tensor)
        for bucket in trainer.actor.full_weights(1 << 20)
        for name, tensor in bucket
    }


def _evaluation_changes_nothing(root: Path) -> list[str]:
    trainer = _trainer(root, ["--enable_engine_sleep", "--normalize_reward", "--init_kl_coef=0.05"])
    trainer.colocation.sync(version=0)
    metrics = trainer.train_step()
    order = list(trainer.colocation.order)
    before = (
        _digests(trainer),
        trainer.sampler.state_dict(),
        attrs.asdict(trainer.maker.reward_moments),
        len(trainer.buffer),
        trainer.buffer.micro_batches(4, epoch=0).__next__().scores.tolist(),
        torch.get_rng_state(),
        trainer.engine.weights_version,
    )
    first = trainer.evaluate()
    second = trainer.evaluate()
    after = (
        _digests(trainer),
        trainer.sampler.state_dict(),
        attrs.asdict(trainer.maker.reward_moments),
        len(trainer.buffer),
        trainer.buffer.micro_batches(4, epoch=0).__next__().scores.tolist(),
        torch.get_rng_state(),
        trainer.engine.weights_version,
    )
    assert first == second  # greedy and unchanged weights: the same score twice
    assert before[0] == after[0], "evaluation changed parameters"
    assert before[1:5] == after[1:5], "evaluation changed sampler, statistics or buffer"
    assert torch.equal(before[5], after[5]), "evaluation changed the RNG"
    assert before[6] == after[6] == 1
    assert trainer.maker.reward_moments.count == 16  # 4 prompts (2 per rank) x 4 samples
    assert metrics["kl"] >= 0.0
    return order


class TestTrainerRanks(DistributedSuite):
    world_size = 2

    def test_phase_order_and_side_effect_free_evaluation(
        self, pool: RankPool, tmp_path: Path
    ) -> None:
        root = pool.shared_dir / tmp_path.name
        orders = pool.run(_evaluation_changes_nothing, root)
        assert orders == [list(PHASES)] * 2
