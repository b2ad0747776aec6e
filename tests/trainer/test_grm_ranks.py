"""Generative reward models end to end on gloo: ``lrft train-rm --generative`` trains a tiny judge
(world 1 and 2) whose exported causal-LM folder then scores through a real ``hf`` RolloutEngine;
its verdicts are parsed as a plain transformers ``generate`` of the same prompts reads them, and
a verdict cut short is counted unparsable and given the configured score."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.rewards import RewardSample, compute_rewards
from lrft.rewards.generative import GenerativeReward, judge_prompt_ids
from lrft.rewards.judge_template import load_judge_template
from lrft.rm import RMTrainConfig, build_rm_trainer
from lrft.testing.distributed import DistributedSuite, RankPool, current_rank_context
from tests.trainer.fixtures import rank_info
from tests.unit.rm.models import save_with_tokenizer, tiny_judge

TEMPLATE = {"prompt": "{prompt}{response}|", "verdict": "<{score}>", "min_score": 0, "max_score": 9}
"""A short judge template: the judge must copy the response's last digit into its verdict."""


def judge_rows(count: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = rng.randrange(10, 100), rng.randrange(10, 100)
        response = str(rng.randrange(10, 200))
        rows.append({"prompt": f"{a}+{b}=", "response": response, "verdict": f"<{response[-1]}>"})
    return rows


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _inputs(root: Path) -> None:
    if current_rank_context().rank == 0 and not (root / "judge").exists():
        root.mkdir(parents=True, exist_ok=True)
        save_with_tokenizer(tiny_judge(seed=1), root / "judge")
        _write(root / "train.jsonl", judge_rows(512, seed=0))
        _write(root / "eval.jsonl", judge_rows(64, seed=1))
        (root / "template.json").write_text(json.dumps(TEMPLATE))
    torch.distributed.barrier()


def train_judge(root: Path, save: str, steps: int) -> dict[str, Any]:
    _inputs(root)
    config = RMTrainConfig(
        pretrain=str(root / "judge"),
        dataset=str(root / "train.jsonl"),
        eval_dataset=str(root / "eval.jsonl"),
        generative=True,
        grm_template=str(root / "template.json"),
        train_batch_size=16,
        micro_train_batch_size=8,
        learning_rate=3e-3,
        max_epochs=100,
        max_steps=steps,
        save_path=str(root / save),
    )
    result = build_rm_trainer(config, rank_info()).fit()
    assert result.first_eval is not None
    assert result.last_eval is not None
    return {"first": result.first_eval, "last": result.last_eval}


def score_with_engine(
    folder: Path, rows: list[dict[str, str]], max_new_tokens: int
) -> dict[str, Any]:
    """The exported judge through the hf engine, against transformers' own greedy generate."""
    template = load_judge_template(str(folder.parent.parent / "template.json"))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    engine = HFRolloutEngine.from_pretrained(
        folder,
        config=HFEngineConfig(dtype=torch.float32, device=torch.device("cpu"), decode="generate"),
    )
    reward = GenerativeReward(
        engine=engine,
        tokenizer=tokenizer,
        template=template,
        max_new_tokens=max_new_tokens,
        stop_token_ids=(tokenizer.eos_token_id,),
        unparsable_score=-5.0,
        name="judge",
    )
    samples = [RewardSample(prompt=r["prompt"], response=r["response"]) for r in rows]
    output = compute_rewards(reward, samples)
    engine.shutdown()

    plain = AutoModelForCausalLM.from_pretrained(folder)
    torch.nn.Module.eval(plain)
    expected = []
    for sample in samples:
        text = template.render(prompt=sample.prompt, response=sample.response, reference=None)
        ids = torch.tensor([judge_prompt_ids(text, tokenizer, chat=False)])
        with torch.no_grad():
            out = plain.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
        verdict = str(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))
        found = re.findall(r"<\s*(\d+)\s*>", verdict)  # the template's form, read independently
        expected.append(float(found[-1]) if found and 0 <= float(found[-1]) <= 9 else None)
    return {
        "scores": list(output.scores),
        "unparsable": list(output.metrics["unparsable"]),
        "expected": expected,
        "targets": [float(r["response"][-1]) for r in rows],
    }


class TestJudgeTrainingWorld1(DistributedSuite):
    world_size = 1

    def test_a_trained_judge_scores_through_the_hf_engine(
        self, pool: RankPool, tmp_path: Path
    ) -> None:
        root = pool.shared_dir / tmp_path.name
        (trained,) = pool.run(train_judge, root, "out", 120)
        assert trained["first"]["eval/verdict_accuracy"] < 0.2
        assert trained["last"]["eval/verdict_accuracy"] >= 0.9, trained
        rows = judge_rows(32, seed=7)
        (scored,) = pool.run(score_with_engine, root / "out" / "hf_model", rows, 8)
        parsed = [s for s, u in zip(scored["scores"], scored["unparsable"], strict=True) if not u]
        assert scored["scores"] == [
            -5.0 if e is None else e for e in scored["expected"]
        ]  # the engine's verdicts read as transformers' own generate reads them
        assert scored["unparsable"] == [float(e is None) for e in scored["expected"]]
        hits = sum(s == t for s, t in zip(scored["scores"], scored["targets"], strict=True))
        assert hits >= 0.9 * len(rows)
        assert len(parsed) >= 0.9 * len(rows)
        # two tokens are too few for "<d>": every verdict is cut, counted and scored -5
        (cut,) = pool.run(score_with_engine, root / "out" / "hf_model", rows[:4], 2)
        assert cut["unparsable"] == [1.0] * 4
        assert cut["scores"] == [-5.0] * 4


class TestJudgeTrainingWorld2(DistributedSuite):
    world_size = 2

    def test_two_ranks_learn_the_same_judge(self, pool: RankPool, tmp_path: Path) -> None:
        root = pool.shared_dir / tmp_path.name
        results = pool.run(train_judge, root, "out2", 120)
        assert results[0] == results[1]  # metrics are summed over ranks: the same on both
        assert results[0]["last"]["eval/verdict_accuracy"] >= 0.9, results[0]
