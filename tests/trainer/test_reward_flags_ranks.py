"""``--reward_pretrain``, ``--remote_rm_url`` and ``--reward_weights`` through the trainer's build
path on two gloo ranks: a reward model saved to disk and a real HTTP service on loopback, summed
with a rule reward, against a plain transformers forward and the service's own rule; and the
smollm2 preset's data and reward around a user's model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
)

from lrft.api.types import Location
from lrft.cli import config_from_args
from lrft.demos.apply import apply_demo_or_preset
from lrft.presets import SMOLLM2_TASK
from lrft.presets.word_problems import INSTRUCTION
from lrft.rewards import CombinedReward, MathVerifyReward, RewardSample, compute_rewards
from lrft.testing.distributed import DistributedSuite, RankPool, current_rank_context
from lrft.trainer.build import build_trainer
from lrft.trainer.rewards import ColocatedRewardModel
from lrft.trainer.trainer import RLTrainer
from tests.trainer.fixtures import (
    base_args,
    digit_fraction,
    make_model_folder,
    make_prompt_files,
    make_reward_model,
    rank_info,
)
from tests.unit.rewards.test_remote import ScriptedServer, length_scores

WEIGHTS = (0.5, 2.0, 0.25)  # reward_fn, reward_pretrain, remote_rm_url

SAMPLES = [
    RewardSample(prompt="12+35=", response="47"),
    RewardSample(prompt="3+4=", response="seven, or 7"),
    RewardSample(prompt="20+22=", response="42!"),
    RewardSample(prompt="1+1=", response="2 2 2 2"),
]


def _build(root: Path, extra: list[str]) -> RLTrainer:
    context = current_rank_context()
    if context.rank == 0 and not (root / "rm").exists():
        make_model_folder(root / "model")
        make_prompt_files(root / "data")
        make_reward_model(root / "rm")
    torch.distributed.barrier()
    args = base_args(
        root / "model", root / "data/train.jsonl", root / "data/eval.jsonl", root / "out"
    )
    info = rank_info()
    return build_trainer(config_from_args([*args, *extra]), info)


def plain_forward(folder: Path, samples: list[RewardSample]) -> list[float]:
    """The reference: each prompt + response alone through transformers' own model."""
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        return [
            float(model(**tokenizer(s.prompt + s.response, return_tensors="pt")).logits[0, 0])
            for s in samples
        ]


def _three_rewards(root: Path, url: str) -> dict[str, Any]:
    trainer = _build(
        root,
        [
            f"--reward_pretrain={root / 'rm'}",
            f"--remote_rm_url={url}",
            f"--reward_weights={','.join(str(w) for w in WEIGHTS)}",
            "--enable_engine_sleep",
        ],
    )
    reward = trainer.maker.reward
    assert isinstance(reward, CombinedReward)
    model_part = reward.routes[""][1].reward
    assert isinstance(model_part, ColocatedRewardModel)
    # unequal batches per rank (3 and 1, then 2 and none): the sharded model's collective
    # forward must still be called alike on both ranks
    rank = current_rank_context().rank
    mine = [SAMPLES[:3], SAMPLES[3:]][rank]
    output = compute_rewards(reward, mine)
    placement = model_part.model.placement.parameters
    second = compute_rewards(reward, [SAMPLES[:2], []][rank])
    plain = plain_forward(root / "rm", mine)
    expected = [
        WEIGHTS[0] * digit_fraction(s) + WEIGHTS[1] * p + WEIGHTS[2] * len(s.response)
        for s, p in zip(mine, plain, strict=True)
    ]
    evaluation = trainer.evaluate()
    return {
        "scores": list(output.scores),
        "expected": expected,
        "parts": {name: list(output.metrics[name]) for name in ("digit_fraction", "remote")},
        "reward_model": list(output.metrics["reward_model"]),
        "plain": plain,
        "second": len(second),
        "placement": placement,
        "eval": sorted(evaluation),
    }


def _preset_data(root: Path) -> dict[str, Any]:
    context = current_rank_context()
    if context.rank == 0 and not (root / "model").exists():
        make_model_folder(root / "model")
    torch.distributed.barrier()
    info = rank_info()
    config = config_from_args(
        [
            "train",
            "--preset=smollm2",
            f"--pretrain={root / 'model'}",
            f"--save_path={root / 'out'}",
            "--no-use_tensorboard",
        ]
    )
    # as lrft train does: the preset's data first
    trainer = build_trainer(apply_demo_or_preset(config, info.rank), info)
    first = trainer.train_data[0]
    return {
        "train": len(trainer.train_data),
        "eval": None if trainer.eval_data is None else len(trainer.eval_data),
        "prompt": first.prompt_text,
        "reference": first.reference,
        "reward": type(trainer.maker.reward).__name__,
    }


class TestRewardFlagsRanks(DistributedSuite):
    world_size = 2

    def test_reward_model_and_service_summed_with_a_rule_reward(
        self, pool: RankPool, tmp_path: Path
    ) -> None:
        server = ScriptedServer(lambda n, body: (200, length_scores(body)))
        try:
            results = pool.run(_three_rewards, pool.shared_dir / tmp_path.name, server.url)
        finally:
            server.close()
        for result in results:
            assert result["scores"] == pytest.approx(result["expected"], abs=1e-5)
            assert result["reward_model"] == pytest.approx(result["plain"], abs=1e-5)
            assert result["placement"] == Location.HOST  # offloaded again after scoring
            assert {"eval/accuracy", "eval/reward_mean"} <= set(result["eval"])
        assert [r["second"] for r in results] == [2, 0]
        assert len({round(s, 4) for r in results for s in r["plain"]}) == len(SAMPLES)
        # one POST per non-empty batch, each sample sent with its response
        posted = [[s["response"] for s in body["samples"]] for body in server.requests]
        assert [s.response for s in SAMPLES[:3]] in posted
        assert [SAMPLES[3].response] in posted

    def test_the_smollm2_preset_brings_data_and_reward_around_a_user_model(
        self, pool: RankPool, tmp_path: Path
    ) -> None:
        results = pool.run(_preset_data, pool.shared_dir / tmp_path.name)
        for result in results:
            assert result["train"] == SMOLLM2_TASK.num_train
            assert result["eval"] == 48  # eval_max_samples of the CPU settings
            # the demo tokenizer's chat template renders the user message as it is
            assert result["prompt"] == SMOLLM2_TASK.train_problems()[0].prompt
            assert result["prompt"].endswith(INSTRUCTION)
            assert result["reference"] == SMOLLM2_TASK.train_problems()[0].reference
            assert result["reward"] == MathVerifyReward.__name__
