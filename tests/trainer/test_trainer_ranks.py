"""The trainer on two gloo ranks (harness): phase order, and evaluation that changes nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import torch

from lrft.api.digest import tensor_digests
from lrft.api.protocols import TrainableModel
from lrft.api.types import Location
from lrft.cli import config_from_args
from lrft.testing.distributed import DistributedSuite, RankPool, current_rank_context
from lrft.trainer import PHASES
from lrft.trainer.build import build_trainer
from lrft.trainer.colocation import CRITIC_PHASES, OPTIONAL_PHASES
from lrft.trainer.trainer import RLTrainer
from tests.trainer.fixtures import base_args, make_model_folder, make_prompt_files, rank_info


def _trainer(root: Path, extra: list[str]) -> RLTrainer:
    context = current_rank_context()
    model = root / "model"
    if context.rank == 0 and not model.exists():
        make_model_folder(model)
        make_prompt_files(root / "data")
    torch.distributed.barrier()
    args = base_args(model, root / "data/train.jsonl", root / "data/eval.jsonl", root / "out")
    config = config_from_args([*args, *extra])
    info = rank_info()
    return build_trainer(config, info)


def _digests(trainer: RLTrainer) -> dict[str, str]:
    digests: dict[str, str] = {}
    for bucket in trainer.actor.full_weights(1 << 20):  # a bucket lives until the next one
        digests.update(tensor_digests(dict(bucket)))
    return digests


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


def _ppo_phases_and_critic_placement(root: Path) -> list[str]:
    trainer = _trainer(
        root, ["--advantage_estimator=gae", "--enable_engine_sleep", "--init_kl_coef=0.05"]
    )
    critic = trainer.critic
    assert critic is not None
    colocation = trainer.colocation
    seen: dict[str, tuple[Location, Location]] = {}

    Phase = Callable[[Callable[[TrainableModel], Any]], Any]

    def watched(phase: str, run: Phase) -> Phase:
        """``run`` (a critic phase), noting the critic's placement while its body runs."""

        def wrapper(fn: Callable[[TrainableModel], Any]) -> Any:
            def inner(model: TrainableModel) -> Any:
                seen[phase] = (critic.placement.parameters, critic.placement.optimizer)
                return fn(model)

            return run(inner)

        return wrapper

    # spies on the two phases, which otherwise leave no trace of where the critic was
    colocation.critic_pass = watched("values", colocation.critic_pass)  # type: ignore[method-assign, assignment]
    colocation.critic_update = watched("update", colocation.critic_update)  # type: ignore[method-assign, assignment]
    colocation.sync(version=0)
    metrics = trainer.train_step()
    # with the engine asleep the critic lives on the host, but for what each of its phases needs
    assert seen == {
        "values": (Location.DEVICE, Location.HOST),
        "update": (Location.DEVICE, Location.DEVICE),
    }
    assert (critic.placement.parameters, critic.placement.optimizer) == (Location.HOST,) * 2
    for name in ("critic/value_loss", "critic/grad_norm", "time/critic_values_s", "time/critic_s"):
        assert name in metrics, name
    return list(colocation.order)


def _host_resident_models_under_engine_sleep(root: Path) -> list[str]:
    # FSDP2 cpu_offload moves nothing (no offload capability), so engine sleep must leave the
    # host-resident reference and critic where they are instead of asking for an offload.
    trainer = _trainer(
        root,
        [
            "--fsdp_cpu_offload",
            "--enable_engine_sleep",
            "--init_kl_coef=0.05",
            "--use_kl_loss",
            "--advantage_estimator=gae",
        ],
    )
    reference = trainer.colocation.reference
    assert reference is not None
    assert trainer.critic is not None
    assert not trainer.colocation.offload_reference
    trainer.colocation.sync(version=0)
    metrics = trainer.train_step()
    assert metrics["kl"] >= 0.0
    assert "critic/value_loss" in metrics
    for model in (reference, trainer.critic, trainer.actor):
        assert model.placement.parameters == Location.HOST
    return list(trainer.colocation.order)


def _weights_before_and_after_a_step(
    root: Path, extra: list[str]
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The actor's and critic's full weights before and after one iteration (two optimizer
    steps of two micro-batches per rank each)."""
    trainer = _trainer(root, ["--advantage_estimator=gae", *extra])
    critic = trainer.critic
    assert critic is not None

    def weights() -> dict[str, torch.Tensor]:
        return {
            f"{role}/{name}": tensor.clone()
            for role, model in (("actor", trainer.actor), ("critic", critic))
            for bucket in model.full_weights(1 << 20)
            for name, tensor in bucket
        }

    before = weights()
    trainer.colocation.sync(version=0)
    trainer.train_step()
    return before, weights()


def _assert_trains_as_the_default(pool: RankPool, root: Path, flags: list[str]) -> None:
    """One iteration with ``flags`` moves the actor and the critic as the default does, up to
    fp32 summation order."""
    untrained, default = pool.run(_weights_before_and_after_a_step, root, [])[0]
    _, changed = pool.run(_weights_before_and_after_a_step, root, flags)[0]
    assert changed.keys() == default.keys()
    moved = {
        name.split("/")[0] for name in default if not torch.equal(default[name], untrained[name])
    }
    assert moved == {"actor", "critic"}
    for name, weight in default.items():
        torch.testing.assert_close(changed[name], weight, rtol=1e-5, atol=1e-6, msg=name)


def _without_teacher_or_process_rewards() -> list[str]:
    """The phases of a run with a critic and no distillation teacher or process rewards."""
    return [p for p in PHASES if p not in OPTIONAL_PHASES - CRITIC_PHASES]


class TestTrainerRanks(DistributedSuite):
    world_size = 2

    def test_phase_order_and_side_effect_free_evaluation(
        self, pool: RankPool, tmp_path: Path
    ) -> None:
        root = pool.shared_dir / tmp_path.name
        orders = pool.run(_evaluation_changes_nothing, root)
        assert orders == [[phase for phase in PHASES if phase not in OPTIONAL_PHASES]] * 2

    def test_ppo_runs_the_critic_phases_with_the_critic_offloaded_outside_them(
        self, pool: RankPool, tmp_path: Path
    ) -> None:
        root = pool.shared_dir / tmp_path.name
        orders = pool.run(_ppo_phases_and_critic_placement, root)
        assert orders == [_without_teacher_or_process_rewards()] * 2

    def test_cpu_offload_with_engine_sleep_keeps_host_resident_models_in_place(
        self, pool: RankPool, tmp_path: Path
    ) -> None:
        root = pool.shared_dir / tmp_path.name
        orders = pool.run(_host_resident_models_under_engine_sleep, root)
        assert orders == [_without_teacher_or_process_rewards()] * 2

    def test_fsdp2_speed_settings_train_the_same(self, pool: RankPool, tmp_path: Path) -> None:
        """Gathered layers kept to backward and gradients reduced once per optimizer step give
        the iteration the default gives, up to fp32 summation order."""
        _assert_trains_as_the_default(
            pool,
            pool.shared_dir / tmp_path.name,
            ["--no-fsdp_reshard_after_forward", "--fsdp_defer_gradient_sync"],
        )

    def test_token_budget_trains_policy_and_critic_the_same(
        self, pool: RankPool, tmp_path: Path
    ) -> None:
        """Packing each step's samples by tokens (policy and critic) gives the iteration the
        fixed micro-batches give, up to fp32 summation order."""
        _assert_trains_as_the_default(
            pool, pool.shared_dir / tmp_path.name, ["--max_tokens_per_micro_batch=24"]
        )
