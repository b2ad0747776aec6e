"""Scalar reward-model training through ``build_rm_trainer`` on gloo, world 1 and 2, through
FSDP2 and DeepSpeed ZeRO (2 and 3, every parameter partitioned), against a plain PyTorch
reference: the same model scoring each pair alone, a hand-written
``-logsigmoid(r_c - r_r).mean()`` over each global batch, ``clip_grad_norm_`` and
``torch.optim.AdamW``. Each step's loss and gradient norm, and the exported weights after the
last step, must match; the export loads with transformers as a one-label classifier."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from lrft.api.protocols import TrainBackend
from lrft.data import DistributedPromptSampler
from lrft.demos.task import AdditionTask
from lrft.rm import RMTrainConfig, build_rm_trainer
from lrft.rm.demo import preference_rows
from lrft.run.metrics import read_metrics
from lrft.testing.distributed import DistributedSuite, RankPool, current_rank_context
from tests.trainer.fixtures import make_model_folder, rank_info

STEPS = 3
BATCH = 8
LR = 1e-3
SEED = 5
HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None


def _inputs(root: Path) -> None:
    if current_rank_context().rank == 0 and not (root / "model").exists():
        make_model_folder(root / "model")
        task = AdditionTask(num_train=40, num_eval=8)
        rows = preference_rows(task.train_problems(), seed=0)[:24]
        rows[1] = {**rows[1], "prompt": rows[1]["prompt"] + " "}  # unequal lengths: padding
        (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    torch.distributed.barrier()


def _deepspeed(stage: int) -> Any:
    def make(config: RMTrainConfig) -> TrainBackend:
        from lrft.backends.train.deepspeed import DeepSpeedBackend, DeepSpeedConfig

        # fp32, and every parameter of the tiny model partitioned under ZeRO-3
        return DeepSpeedBackend(
            DeepSpeedConfig(zero_stage=stage, mixed_precision=False, param_persistence_threshold=0)  # type: ignore[arg-type]  # 2 or 3
        )

    return make


SCHEDULED = {"l2": 0.1, "max_norm": 0.5, "lr_scheduler": "cosine", "lr_warmup_steps": 1}
"""Weight decay, a tighter clip and a warmed-up cosine schedule, against the reference's."""
MULTIPLIERS = {"constant": [1.0, 1.0, 1.0], "cosine": [0.5, 1.0, 0.5]}
"""The LR multiplier of steps 0, 1, 2: warm-up (0 + 1) / (1 + 1), then 0.5 (1 + cos(pi p)) with
p = 0 and 1/2 of the two steps after it."""


def small_config(
    root: Path, dataset: str, save: str, zero_stage: int | None, *, steps: int, **settings: Any
) -> RMTrainConfig:
    """``steps`` optimizer steps on ``root``'s model and ``dataset``, batches of ``BATCH``."""
    return RMTrainConfig(
        pretrain=str(root / "model"),
        dataset=str(root / dataset),
        train_batch_size=BATCH,
        micro_train_batch_size=2,
        learning_rate=LR,
        max_steps=steps,
        seed=SEED,
        save_path=str(root / save),
        zero_stage=zero_stage,
        **settings,
    )


def fitted(config: RMTrainConfig, zero_stage: int | None) -> tuple[Any, dict[str, torch.Tensor]]:
    """This rank's trainer of ``config`` after its fit, and its score head before it."""
    kwargs = {} if zero_stage is None else {"backend": _deepspeed(zero_stage)}
    trainer = build_rm_trainer(config, rank_info(), **kwargs)
    head: dict[str, torch.Tensor] = {}
    for bucket in trainer.model.full_weights(2**20):
        head.update({n: t.clone() for n, t in bucket if n.startswith("score.")})
    trainer.fit()
    return trainer, head


def train(
    root: Path, save: str, zero_stage: int | None, settings: dict[str, Any]
) -> dict[str, Any]:
    _inputs(root)
    config = small_config(root, "pairs.jsonl", save, zero_stage, steps=STEPS, **settings)
    trainer, head = fitted(config, zero_stage)
    return {"head": head, "backend": trainer.model.__class__.__name__}


def reference(
    root: Path, head: dict[str, torch.Tensor], settings: dict[str, Any]
) -> tuple[list[dict[str, float]], dict[str, torch.Tensor]]:
    """Plain PyTorch: each pair alone through transformers' model, the loss by hand."""
    tokenizer = AutoTokenizer.from_pretrained(root / "model")
    model = AutoModelForSequenceClassification.from_pretrained(root / "model", num_labels=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    model.load_state_dict(head, strict=False)
    rows = [json.loads(line) for line in (root / "pairs.jsonl").read_text().splitlines()]
    sampler = DistributedPromptSampler(
        num_samples=len(rows), global_batch_size=BATCH, rank=0, world_size=1, seed=SEED
    )
    decay, clip = settings.get("l2", 0.0), settings.get("max_norm", 1.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=decay)
    multipliers = MULTIPLIERS[settings.get("lr_scheduler", "constant")]

    def score(text: str) -> torch.Tensor:
        ids = torch.tensor([tokenizer.encode(text)])
        logits: torch.Tensor = model(input_ids=ids).logits
        return logits[0, 0]

    steps = []
    for step in range(STEPS):
        batch = [rows[i] for i in sampler.next_batch().indices]
        chosen = torch.stack([score(r["prompt"] + r["chosen"]) for r in batch])
        rejected = torch.stack([score(r["prompt"] + r["rejected"]) for r in batch])
        loss = -F.logsigmoid(chosen - rejected).mean()
        optimizer.zero_grad()
        torch.autograd.backward(loss)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=clip)
        for group in optimizer.param_groups:
            group["lr"] = LR * multipliers[step]
        optimizer.step()
        steps.append(
            {
                "train/loss": float(loss.detach()),
                "train/grad_norm": float(norm),
                "train/lr": LR * multipliers[step],
            }
        )
    return steps, {n: p.detach() for n, p in model.named_parameters()}


def _check(root: Path, save: str, result: dict[str, Any], settings: dict[str, Any]) -> None:
    expected_steps, expected_weights = reference(root, result["head"], settings)
    records = [r for r in read_metrics(root / save / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for record, expected in zip(records, expected_steps, strict=True):
        assert record["train/loss"] == pytest.approx(expected["train/loss"], rel=1e-5)
        assert record["train/grad_norm"] == pytest.approx(expected["train/grad_norm"], rel=1e-4)
        assert record["train/lr"] == pytest.approx(expected["train/lr"], rel=1e-9)
    exported = AutoModelForSequenceClassification.from_pretrained(root / save / "hf_model")
    assert exported.config.num_labels == 1
    assert exported.config.pad_token_id is not None
    weights = dict(exported.named_parameters())
    assert weights.keys() == expected_weights.keys()
    for name, tensor in expected_weights.items():
        torch.testing.assert_close(weights[name], tensor, rtol=0, atol=2e-5, msg=name)
    initial = AutoModelForCausalLM.from_pretrained(root / "model").model.state_dict()
    moved = [n for n, t in initial.items() if not torch.equal(weights[f"model.{n}"], t)]
    assert len(moved) == len(initial)  # training moved every backbone tensor


def load_headless(root: Path) -> str:
    """A causal LM saved as a one-label classifier's config without its architecture: the
    folder passes the config checks, and loading finds the score head missing."""
    from lrft.api.errors import ConfigError
    from lrft.backends.train.fsdp2 import FSDP2Backend
    from lrft.config import TrainConfig
    from lrft.trainer.rewards import check_reward_settings, load_reward_model

    folder = make_model_folder(root / "headless")
    config_file = folder / "config.json"
    values = json.loads(config_file.read_text())
    values.pop("architectures")
    values["id2label"] = {"0": "LABEL_0"}
    config_file.write_text(json.dumps(values))
    config = TrainConfig(pretrain="m", prompt_data="p", reward_pretrain=[str(folder)])
    check_reward_settings(config)
    try:
        load_reward_model(str(folder), name="reward_model", backend=FSDP2Backend(), config=config)
    except ConfigError as error:
        return str(error)
    return "loaded"


class TestRewardModelTrainingWorld1(DistributedSuite):
    world_size = 1

    def test_a_folder_whose_score_head_is_missing_is_refused_when_loaded(
        self, pool: RankPool, tmp_path: Path
    ) -> None:
        (message,) = pool.run(load_headless, pool.shared_dir / tmp_path.name)
        assert "lacks the weights ['score.weight']" in message
        assert "a reward model is a *ForSequenceClassification folder with one label" in message

    def test_fsdp2_matches_plain_pytorch(self, pool: RankPool, tmp_path: Path) -> None:
        root = pool.shared_dir / tmp_path.name
        (result,) = pool.run(train, root, "fsdp2", None, SCHEDULED)
        assert result["backend"] == "FSDP2TrainableModel"
        _check(root, "fsdp2", result, SCHEDULED)

    @pytest.mark.skipif(
        not HAS_DEEPSPEED, reason="deepspeed is not installed: pip install 'lrft[deepspeed]'"
    )
    def test_zero2_matches_plain_pytorch(self, pool: RankPool, tmp_path: Path) -> None:
        root = pool.shared_dir / tmp_path.name
        (result,) = pool.run(train, root, "zero2", 2, {})
        assert result["backend"] == "DeepSpeedTrainableModel"
        _check(root, "zero2", result, {})


class TestRewardModelTrainingWorld2(DistributedSuite):
    world_size = 2

    def test_fsdp2_matches_plain_pytorch(self, pool: RankPool, tmp_path: Path) -> None:
        root = pool.shared_dir / tmp_path.name
        results = pool.run(train, root, "fsdp2", None, {})
        _check(root, "fsdp2", results[0], {})

    @pytest.mark.skipif(
        not HAS_DEEPSPEED, reason="deepspeed is not installed: pip install 'lrft[deepspeed]'"
    )
    def test_zero3_matches_plain_pytorch(self, pool: RankPool, tmp_path: Path) -> None:
        root = pool.shared_dir / tmp_path.name
        results = pool.run(train, root, "zero3", 3, SCHEDULED)
        assert results[0]["backend"] == "DeepSpeedTrainableModel"
        _check(root, "zero3", results[0], SCHEDULED)
