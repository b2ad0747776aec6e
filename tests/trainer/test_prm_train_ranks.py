"""``lrft train-rm --step_separator``: a process reward model trained on step-labelled rows
through ``build_rm_trainer`` on two gloo ranks, FSDP2 and ZeRO-3, against plain PyTorch (each
row alone through transformers' token classifier, the binary cross-entropy of each step's label
at its last token averaged over the global batch's steps by hand, ``clip_grad_norm_`` and
``torch.optim.AdamW``): each step's loss and gradient norm and the exported weights match, and
the export is a folder ``lrft train --prm_pretrain`` accepts."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForTokenClassification, AutoTokenizer

from lrft.config import TrainConfig
from lrft.data import DistributedPromptSampler
from lrft.rewards.process import step_ends
from lrft.run.metrics import read_metrics
from lrft.testing.distributed import DistributedSuite, RankPool, current_rank_context
from lrft.trainer.process_rewards import check_process_reward_model
from tests.trainer.fixtures import make_model_folder
from tests.trainer.test_rm_ranks import BATCH, LR, SEED, fitted, small_config

STEPS = 2
SEPARATOR = ";"


def step_rows(count: int, seed: int) -> list[dict[str, Any]]:
    """Sums of three numbers worked in two steps, some steps wrong (label 0)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b, c = rng.randrange(10, 50), rng.randrange(10, 50), rng.randrange(1, 10)
        first = a + b + (rng.random() < 0.3)
        second = first + c + (rng.random() < 0.3)
        rows.append(
            {
                "prompt": f"{a}+{b}+{c}=",
                "steps": [f"{a}+{b}={first}", f"{first}+{c}={second}"],
                "labels": [int(first == a + b), int(second == a + b + c)],
            }
        )
    return rows


def _inputs(root: Path) -> None:
    if current_rank_context().rank == 0 and not (root / "model").exists():
        make_model_folder(root / "model")
        rows = step_rows(24, seed=0)
        (root / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    torch.distributed.barrier()


def train(root: Path, save: str, zero_stage: int | None) -> dict[str, Any]:
    _inputs(root)
    config = small_config(
        root, "steps.jsonl", save, zero_stage, steps=STEPS, step_separator=SEPARATOR
    )
    _, head = fitted(config, zero_stage)
    return {"head": head}


def reference(
    root: Path, head: dict[str, torch.Tensor]
) -> tuple[list[dict[str, float]], dict[str, torch.Tensor]]:
    tokenizer = AutoTokenizer.from_pretrained(root / "model")
    model = AutoModelForTokenClassification.from_pretrained(root / "model", num_labels=1)
    model.load_state_dict(head, strict=False)
    rows = [json.loads(line) for line in (root / "steps.jsonl").read_text().splitlines()]
    sampler = DistributedPromptSampler(
        num_samples=len(rows), global_batch_size=BATCH, rank=0, world_size=1, seed=SEED
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)

    def step_logits(row: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        prompt = tokenizer.encode(row["prompt"], add_special_tokens=False)
        response = tokenizer.encode(SEPARATOR.join(row["steps"]), add_special_tokens=False)
        ends = step_ends(response, SEPARATOR, lambda ids: str(tokenizer.decode(list(ids))))
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0, :, 0]
        return logits[[len(prompt) + end for end in ends]], torch.tensor(row["labels"]).float()

    steps = []
    for _ in range(STEPS):
        batch = [rows[i] for i in sampler.next_batch().indices]
        pairs = [step_logits(row) for row in batch]
        logits = torch.cat([p[0] for p in pairs])
        labels = torch.cat([p[1] for p in pairs])
        loss = F.binary_cross_entropy_with_logits(logits, labels)  # the mean over steps
        optimizer.zero_grad()
        torch.autograd.backward(loss)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
        steps.append({"train/loss": float(loss.detach()), "train/grad_norm": float(norm)})
    return steps, {n: p.detach() for n, p in model.named_parameters()}


def _check(root: Path, save: str, result: dict[str, Any]) -> None:
    expected_steps, expected_weights = reference(root, result["head"])
    records = [r for r in read_metrics(root / save / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for record, expected in zip(records, expected_steps, strict=True):
        assert record["train/loss"] == pytest.approx(expected["train/loss"], rel=1e-5)
        assert record["train/grad_norm"] == pytest.approx(expected["train/grad_norm"], rel=1e-4)
    folder = root / save / "hf_model"
    exported = AutoModelForTokenClassification.from_pretrained(folder)
    assert exported.config.num_labels == 1
    weights = dict(exported.named_parameters())
    assert weights.keys() == expected_weights.keys()
    for name, tensor in expected_weights.items():
        torch.testing.assert_close(weights[name], tensor, rtol=0, atol=2e-5, msg=name)
    # what lrft train checks of a --prm_pretrain folder before it starts
    check_process_reward_model(
        TrainConfig(
            pretrain=str(root / "model"),
            prompt_data="p",
            reward_fn="math",
            prm_pretrain=str(folder),
            prm_step_separator=SEPARATOR,
        )
    )


class TestProcessRewardModelTraining(DistributedSuite):
    world_size = 2

    @pytest.mark.parametrize("zero_stage", [None, 3], ids=["fsdp2", "zero3"])
    def test_matches_plain_pytorch_and_exports_what_lrft_train_reads(
        self, pool: RankPool, tmp_path: Path, zero_stage: int | None
    ) -> None:
        if zero_stage is not None and importlib.util.find_spec("deepspeed") is None:
            pytest.skip("deepspeed is not installed: pip install 'lrft[deepspeed]'")
        root = pool.shared_dir / tmp_path.name
        save = "fsdp2" if zero_stage is None else "zero3"
        results = pool.run(train, root, save, zero_stage)
        _check(root, save, results[0])
