"""The trainer on prompts with images, on two gloo ranks: a tiny Qwen2-VL trained with GRPO under
FSDP2 and under DeepSpeed ZeRO-3 (the actor and a KL reference both see the images), the
weights (vision tower and projector included) synced into the hf engine and verified, and
``--freeze_vision_tower`` leaving the tower as loaded while its projector trains, its weights
skipped by a changes-only sync into an engine that still holds them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from lrft.api.digest import tensor_digests
from lrft.cli import config_from_args
from lrft.demos.vision.task import ShapeCountTask, write_problems
from lrft.testing.distributed import DistributedSuite, RankPool, current_rank_context
from lrft.testing.vision_models import save_tiny_vlm
from lrft.trainer.build import build_trainer
from tests.trainer.fixtures import REWARD_FLAG, rank_info

ZERO3 = ["--zero_stage=3"]
DEEPSPEED = importlib.util.find_spec("deepspeed") is not None


def _args(root: Path, extra: list[str]) -> list[str]:
    return [
        "train",
        f"--pretrain={root}/model",
        f"--prompt_data={root}/data/train.jsonl",
        f"--eval_dataset={root}/data/eval.jsonl",
        "--images_key=images",
        "--apply_chat_template",
        "--reference_key=answer",
        REWARD_FLAG,
        "--n_samples_per_prompt=4",
        "--rollout_batch_size=4",
        "--micro_rollout_batch_size=2",
        "--train_batch_size=8",
        "--micro_train_batch_size=2",
        "--generate_max_len=4",
        "--actor_learning_rate=1e-3",
        "--init_kl_coef=0.05",
        "--enable_engine_sleep",
        f"--save_path={root}/out",
        *extra,
    ]


def _one_step(root: Path, extra: list[str]) -> dict[str, object]:
    """Build, sync, one iteration, sync again; what moved and what the engine holds."""
    context = current_rank_context()
    if context.rank == 0 and not (root / "model").exists():
        save_tiny_vlm(root / "model")
        task = ShapeCountTask(num_train=16, num_eval=4)
        write_problems(root / "data/train.jsonl", task.train_scenes(), stem="train")
        write_problems(root / "data/eval.jsonl", task.eval_scenes(), stem="eval")
    torch.distributed.barrier()
    info = rank_info()
    trainer = build_trainer(config_from_args(_args(root, extra)), info)

    def weights() -> dict[str, torch.Tensor]:
        return {
            name: tensor.clone()
            for bucket in trainer.actor.full_weights(1 << 20)
            for name, tensor in bucket
        }

    before = weights()
    trainer.colocation.sync(version=0)
    metrics = trainer.train_step()
    after = weights()
    report = trainer.colocation.sync(version=trainer.step + 1)
    engine = trainer.engine
    engine.wake()
    moved = sorted(name for name in after if not torch.equal(after[name], before[name]))
    return {
        "moved": moved,
        "names": sorted(after),
        "metrics": metrics,
        "verified": report.verified,
        "sent": report.tensors,
        "unchanged": report.unchanged,
        "engine_matches": engine.weights_digest() == tensor_digests(after),
        "images": "images" in engine.capabilities.names(),
    }


def _check(results: list[dict[str, object]], *, frozen: bool) -> None:
    first = results[0]
    names = first["names"]
    moved = first["moved"]
    assert isinstance(names, list)
    assert isinstance(moved, list)
    metrics = first["metrics"]
    assert isinstance(metrics, dict)
    assert torch.isfinite(torch.tensor(metrics["policy/policy_loss"]))
    assert metrics["kl"] >= 0.0
    assert first["images"] is True
    tower = [n for n in names if ".visual." in n and ".merger." not in n]
    projector = [n for n in names if ".visual.merger." in n]
    assert tower
    assert projector
    assert set(projector) <= set(moved), "the projector must train"
    assert any(".language_model." in n for n in moved)
    if frozen:
        assert not set(tower) & set(moved), "a frozen vision tower moved"
    else:
        assert set(tower) & set(moved), "the vision tower did not train"
    assert all(result["engine_matches"] for result in results), "the engine holds other weights"
    assert all(result["verified"] is True for result in results)
    # The last sync follows the step's own: the engine still holds every weight, so a changes-
    # only sync sends what training changes and skips a frozen tower.
    assert first["unchanged"] == (len(tower) if frozen else 0), first["unchanged"]
    assert first["sent"] == len(names) - (len(tower) if frozen else 0), first["sent"]


class TestMediaTrainerRanks(DistributedSuite):
    world_size = 2

    def test_fsdp2_trains_on_images(self, pool: RankPool, tmp_path: Path) -> None:
        root = pool.shared_dir / tmp_path.name
        _check(pool.run(_one_step, root, []), frozen=False)

    def test_frozen_vision_tower_stays_as_loaded(self, pool: RankPool, tmp_path: Path) -> None:
        root = pool.shared_dir / tmp_path.name
        _check(pool.run(_one_step, root, ["--freeze_vision_tower"]), frozen=True)

    @pytest.mark.parametrize(
        "backend",
        [
            pytest.param([], id="fsdp2"),
            pytest.param(
                ZERO3,
                id="zero3",
                marks=pytest.mark.skipif(not DEEPSPEED, reason="deepspeed is not installed"),
            ),
        ],
    )
    def test_ppo_critic_sees_the_images(
        self, pool: RankPool, tmp_path: Path, backend: list[str]
    ) -> None:
        """PPO (gae) on prompts with images: the critic (a Qwen2-VL backbone with a value head)
        is built from the VLM's folder and trains on the same rows, images included."""
        root = pool.shared_dir / tmp_path.name
        results = pool.run(_one_step, root, ["--advantage_estimator=gae", *backend])
        metrics = results[0]["metrics"]
        assert isinstance(metrics, dict)
        assert metrics["critic/skipped_steps"] == 0.0
        assert metrics["critic/grad_norm"] > 0.0
        assert all(result["verified"] is True for result in results)

    def test_lora_adapters_on_the_language_model_only(self, pool: RankPool, tmp_path: Path) -> None:
        """LoRA on a VLM: adapters on the language model's q/v projections train them (the
        engine gets the merged weights), the tower and projector stay as loaded, and the KL
        reference is the actor with its adapters off."""
        root = pool.shared_dir / tmp_path.name
        lora = ["--lora_rank=4", "--lora_alpha=8", "--target_modules", "q_proj", "v_proj"]
        results = pool.run(_one_step, root, lora)
        first = results[0]
        moved, names = first["moved"], first["names"]
        assert isinstance(moved, list)
        assert isinstance(names, list)
        projections = {n for n in names if ".language_model." in n and "_proj.weight" in n}
        adapted = {n for n in projections if ".q_proj." in n or ".v_proj." in n}
        assert adapted
        assert set(moved) == adapted, sorted(set(moved) ^ adapted)
        metrics = first["metrics"]
        assert isinstance(metrics, dict)
        assert metrics["kl"] >= 0.0
        assert all(result["engine_matches"] for result in results)
        assert all(result["verified"] is True for result in results)

    @pytest.mark.skipif(not DEEPSPEED, reason="deepspeed is not installed")
    def test_zero3_trains_on_images(self, pool: RankPool, tmp_path: Path) -> None:
        root = pool.shared_dir / tmp_path.name
        _check(pool.run(_one_step, root, ZERO3), frozen=False)
