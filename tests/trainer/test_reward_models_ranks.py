"""Several reward models at once through the trainer's build path on two gloo ranks: two scalar
RMs, a generative judge and a rule reward, weighted and per data label (recipes), each model
resident only during its own call (recorded from inside every forward and generate), against a
plain transformers forward of each sample alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from lrft.api.types import Location
from lrft.cli import config_from_args
from lrft.rewards import CombinedReward, RewardSample, compute_rewards
from lrft.testing.distributed import DistributedSuite, RankPool, current_rank_context
from lrft.trainer.build import build_trainer
from lrft.trainer.judges import ColocatedJudge
from lrft.trainer.rewards import ColocatedRewardModel
from lrft.trainer.trainer import RLTrainer
from tests.trainer.fixtures import base_args, digit_fraction, make_model_folder, rank_info
from tests.trainer.test_reward_flags_ranks import plain_forward
from tests.unit.rm.models import save_with_tokenizer, tiny_classifier, tiny_judge

UNPARSABLE = 0.25
WEIGHTS = (0.5, 2.0, -1.0, 3.0)  # reward_fn, reward_model_0, reward_model_1, grm
RECIPES = {
    "math": {"digit_fraction": 1.0, "reward_model_0": 0.5},
    "chat": {"reward_model_1": 1.0, "grm": 2.0},
}
SAMPLES = [
    RewardSample(prompt="12+35=", response="47", label="math"),
    RewardSample(prompt="3+4=", response="seven, or 7", label="chat"),
    RewardSample(prompt="20+22=", response="42!", label="chat"),
    RewardSample(prompt="1+1=", response="2 2 2 2", label="math"),
]


def _inputs(root: Path) -> None:
    if current_rank_context().rank == 0 and not (root / "judge").exists():
        make_model_folder(root / "model")
        save_with_tokenizer(tiny_classifier(seed=11), root / "rm0")
        save_with_tokenizer(tiny_classifier(seed=12), root / "rm1")
        save_with_tokenizer(tiny_judge(seed=13), root / "judge")
        rows = [
            {"input": f"{a}+{b}=", "answer": str(a + b), "kind": ("math", "chat")[a % 2]}
            for a, b in ((12, 35), (3, 4), (20, 22), (1, 1), (7, 8), (40, 2), (9, 9), (5, 6))
        ]
        for name in ("train.jsonl", "eval.jsonl"):
            (root / name).write_text("".join(json.dumps(row) + "\n" for row in rows))
        (root / "recipes.json").write_text(json.dumps(RECIPES))
    torch.distributed.barrier()


def _trainer(root: Path, extra: list[str], *, models: bool = True) -> RLTrainer:

    args = base_args(root / "model", root / "train.jsonl", root / "eval.jsonl", root / "out")
    judged = [
        f"--reward_pretrain={root / 'rm0'},{root / 'rm1'}",
        f"--grm_pretrain={root / 'judge'}",
        f"--grm_unparsable_score={UNPARSABLE}",
        "--grm_max_new_tokens=3",
    ]
    flags = [
        *(judged if models else []),
        "--enable_engine_sleep",
        "--label_key=kind",
        "--overwrite_output",
        *extra,
    ]
    info = rank_info()
    return build_trainer(config_from_args([*args, *flags]), info)


def _parts(reward: CombinedReward) -> tuple[list[ColocatedRewardModel], ColocatedJudge]:
    parts = {part.reward.name: part.reward for route in reward.routes.values() for part in route}
    models = [parts["reward_model_0"], parts["reward_model_1"]]
    judge = parts["grm"]
    assert all(isinstance(m, ColocatedRewardModel) for m in models)
    assert isinstance(judge, ColocatedJudge)
    return models, judge  # type: ignore[return-value]  # checked just above


def _record_residency(models: list[ColocatedRewardModel], judge: ColocatedJudge) -> list[Any]:
    """A record, from inside each model's forward (and the judge's generate), of which models
    are resident at that moment."""
    records: list[Any] = []

    def snapshot(who: str) -> None:
        records.append(
            (
                who,
                tuple(m.model.placement.parameters is Location.DEVICE for m in models),
                judge.reward.engine.state.awake,
            )
        )

    for index, model in enumerate(models):
        model.model.module.register_forward_pre_hook(
            lambda *_, index=index: snapshot(f"reward_model_{index}")
        )
    engine_model = judge.reward.engine.model  # type: ignore[attr-defined]  # the hf engine's
    engine_model.register_forward_pre_hook(lambda *_: snapshot("grm"))
    return records


def weighted(root: Path) -> dict[str, Any]:
    _inputs(root)
    weights = ",".join(str(w) for w in WEIGHTS)
    trainer = _trainer(root, [f"--reward_weights={weights}"])
    reward = trainer.maker.reward
    assert isinstance(reward, CombinedReward)
    models, judge = _parts(reward)
    records = _record_residency(models, judge)
    mine = [SAMPLES[:3], SAMPLES[3:]][current_rank_context().rank]
    output = compute_rewards(reward, mine)
    again = compute_rewards(reward, mine)  # a model left resident by the first would show here
    assert again.scores == output.scores
    after = (
        [m.model.placement.parameters for m in models],
        judge.reward.engine.state.awake,
    )
    plain = [plain_forward(root / name, mine) for name in ("rm0", "rm1")]
    return {
        "scores": list(output.scores),
        "expected": [
            WEIGHTS[0] * digit_fraction(s)
            + WEIGHTS[1] * p0
            + WEIGHTS[2] * p1
            + WEIGHTS[3] * UNPARSABLE
            for s, p0, p1 in zip(mine, *plain, strict=True)
        ],
        "parts": {
            name: list(output.metrics[name]) for name in ("reward_model_0", "reward_model_1", "grm")
        },
        "plain": plain,
        "unparsable": list(output.metrics["grm/unparsable"]),
        "verdict_tokens": list(output.metrics["grm/verdict_tokens"]),
        "records": records,
        "after": after,
    }


def by_label(root: Path) -> dict[str, Any]:
    _inputs(root)
    trainer = _trainer(root, [f"--reward_recipes={root / 'recipes.json'}"])
    reward = trainer.maker.reward
    assert isinstance(reward, CombinedReward)
    output = compute_rewards(reward, SAMPLES)
    plain = [plain_forward(root / name, SAMPLES) for name in ("rm0", "rm1")]
    expected = []
    for sample, p0, p1 in zip(SAMPLES, *plain, strict=True):
        if sample.label == "math":
            expected.append(digit_fraction(sample) + 0.5 * p0)
        else:
            expected.append(p1 + 2.0 * UNPARSABLE)
    return {
        "scores": list(output.scores),
        "expected": expected,
        "grm": list(output.metrics["grm"]),
        "labels": sorted(reward.routes),
    }


def remote_openrlhf(root: Path, url: str) -> dict[str, Any]:
    import os

    _inputs(root)
    os.environ["LRFT_TEST_RM_TOKEN"] = "rank-token"
    flags = [
        f"--remote_rm_url={url}",
        "--remote_rm_protocol=openrlhf",
        "--remote_rm_batch_size=2",
        "--remote_rm_max_concurrency=2",
        "--remote_rm_auth_env=LRFT_TEST_RM_TOKEN",
    ]
    trainer = _trainer(root, flags, models=False)
    reward = trainer.maker.reward
    assert isinstance(reward, CombinedReward)
    mine = [SAMPLES[:3], SAMPLES[3:]][current_rank_context().rank]
    output = compute_rewards(reward, mine)
    return {
        "remote": list(output.metrics["remote"]),
        "expected": [float(len(s.prompt + s.response)) for s in mine],
    }


class TestSeveralRewardModels(DistributedSuite):
    world_size = 2

    def test_weighted_models_are_resident_one_at_a_time(
        self, pool: RankPool, tmp_path: Path
    ) -> None:
        results = pool.run(weighted, pool.shared_dir / tmp_path.name)
        for result in results:
            assert result["scores"] == pytest.approx(result["expected"], abs=1e-5)
            assert result["parts"]["reward_model_0"] == pytest.approx(result["plain"][0], abs=1e-5)
            assert result["parts"]["reward_model_1"] == pytest.approx(result["plain"][1], abs=1e-5)
            # the untrained judge writes no verdict: counted, and scored as configured
            assert result["parts"]["grm"] == [UNPARSABLE] * len(result["scores"])
            assert result["unparsable"] == [1.0] * len(result["scores"])
            assert max(result["verdict_tokens"]) == 3  # --grm_max_new_tokens
            residency: dict[str, set[Any]] = {
                who: set() for who in ("reward_model_0", "reward_model_1", "grm")
            }
            for who, models, judge_awake in result["records"]:
                residency[who].add((models, judge_awake))
            assert residency == {
                "reward_model_0": {((True, False), False)},
                "reward_model_1": {((False, True), False)},
                "grm": {((False, False), True)},
            }
            assert result["after"] == ([Location.HOST, Location.HOST], False)
        # rank 1 has one sample, rank 0 three: the sharded models' forwards still ran alike
        assert len(results[0]["scores"]) == 3
        assert len(results[1]["scores"]) == 1

    def test_recipes_weigh_each_label_with_its_own_rewards(
        self, pool: RankPool, tmp_path: Path
    ) -> None:
        results = pool.run(by_label, pool.shared_dir / tmp_path.name)
        for result in results:
            assert result["labels"] == ["chat", "math"]
            assert result["scores"] == pytest.approx(result["expected"], abs=1e-5)
            # the judge scored the chat samples only
            assert [g == g for g in result["grm"]] == [s.label == "chat" for s in SAMPLES]

    def test_a_service_in_openrlhf_format_batched_and_authorized(
        self, pool: RankPool, tmp_path: Path
    ) -> None:
        from tests.unit.rewards.test_remote import ScriptedServer
        from tests.unit.rewards.test_remote_protocols import openrlhf_service

        server = ScriptedServer(lambda n, body: (200, openrlhf_service(body)))
        try:
            results = pool.run(remote_openrlhf, pool.shared_dir / tmp_path.name, server.url)
        finally:
            server.close()
        for result in results:
            assert result["remote"] == result["expected"]
        # rank 0's three samples went in POSTs of two and one, rank 1's one in one
        assert sorted(len(body["query"]) for body in server.requests) == [1, 1, 2]
        assert all(set(body) == {"query", "prompts", "labels"} for body in server.requests)
        assert {h["authorization"] for h in server.headers} == {"Bearer rank-token"}
