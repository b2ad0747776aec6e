"""``lrft eval`` end to end: on two torchrun ranks over a model folder (every prompt scored once,
greedy scores against transformers' own greedy generate scored by the same reward, pass@k and
mean@n against the unbiased estimator written out, per-label rows, the table and the JSON
report), and on a checkpoint, which scores as the model exported from it."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lrft.rewards import RewardSample
from tests.trainer.fixtures import base_args, digit_fraction, make_model_folder, make_prompt_files

ROOT = Path(__file__).resolve().parents[2]
REWARD = "--reward_fn=tests.trainer.fixtures:digit_fraction"
THRESHOLD = 0.2
NEW_TOKENS = 4
PROMPTS = [(f"{a}+{b}=", "small" if a < 50 else "large") for a, b in
           [(12, 7), (31, 40), (66, 21), (90, 9), (5, 5), (77, 13), (48, 2)]]  # fmt: skip
"""Seven prompts: an odd count, so the two ranks' shards differ in size."""


def _env() -> dict[str, str]:
    paths = [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, paths)), OMP_NUM_THREADS="1")


def _lrft(args: list[str], ranks: int) -> subprocess.CompletedProcess[str]:
    launcher = [sys.executable]
    if ranks > 1:
        port = str(29700 + os.getpid() % 150)
        launcher += ["-m", "torch.distributed.run", "--nproc_per_node", str(ranks)]
        launcher += ["--master_port", port]
    done = subprocess.run(
        [*launcher, "-m", "lrft", *args],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done


def _eval_args(model: Path, data: Path, output: Path, *extra: str) -> list[str]:
    return [
        "eval",
        f"--model={model}",
        f"--dataset={data}",
        "--input_key=prompt",
        "--label_key=label",
        REWARD,
        f"--generate_max_len={NEW_TOKENS}",
        "--micro_rollout_batch_size=2",
        f"--correct_above={THRESHOLD}",
        f"--output={output}",
        *extra,
    ]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("eval")
    data = root / "prompts.jsonl"
    rows = [{"prompt": p, "label": label} for p, label in PROMPTS]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return make_model_folder(root / "model", seed=3), data


def _reference_greedy_scores(model_dir: Path) -> list[float]:
    """transformers' greedy generate on each prompt, scored by the same reward function."""
    return [score for score, _ in _reference_greedy(model_dir)]


def _reference_greedy(model_dir: Path) -> list[tuple[float, str]]:
    """transformers' greedy generate on each prompt: its score by the same reward function and
    its text."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    scored = []
    for prompt, label in PROMPTS:
        ids = torch.tensor([tokenizer(prompt, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False,
                max_new_tokens=NEW_TOKENS, pad_token_id=tokenizer.pad_token_id,
            )  # fmt: skip
        text = str(tokenizer.decode(out[0, ids.shape[1] :].tolist(), skip_special_tokens=True))
        score = digit_fraction(RewardSample(prompt=prompt, response=text, label=label))
        scored.append((score, text))
    return scored


def _pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. (2021): 1 - C(n - c, k) / C(n, k)."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _summary(rows: list[dict[str, Any]], n: int, ks: tuple[int, ...]) -> dict[str, float]:
    correct = [sum(s > THRESHOLD for s in row["sample_scores"]) for row in rows]
    summary = {f"pass@{k}": sum(_pass_at_k(n, c, k) for c in correct) / len(rows) for k in ks}
    summary[f"mean@{n}"] = sum(c / n for c in correct) / len(rows)
    greedy = [row["greedy_score"] > THRESHOLD for row in rows]
    summary["greedy/accuracy"] = sum(greedy) / len(rows)
    return summary


def test_eval_on_two_ranks_scores_every_prompt_once_with_the_published_metrics(
    inputs: tuple[Path, Path], tmp_path: Path
) -> None:
    model, data = inputs
    report_path = tmp_path / "report.json"
    args = _eval_args(model, data, report_path, "--n_samples=4", "--pass_k=1,2,4")
    done = _lrft([*args, "--temperature=1.0"], ranks=2)
    report = json.loads(report_path.read_text())
    rows = report["per_prompt"]
    assert [row["index"] for row in rows] == list(range(len(PROMPTS)))
    assert [row["label"] for row in rows] == [label for _, label in PROMPTS]
    assert all(len(row["sample_scores"]) == 4 for row in rows)
    reference = _reference_greedy_scores(model)
    assert [row["greedy_score"] for row in rows] == pytest.approx(reference)
    # the responses scored are in the report: the greedy one is transformers' greedy text, and
    # each sampled one scores as reported under the same reward
    assert [row["prompt"] for row in rows] == [prompt for prompt, _ in PROMPTS]
    assert [row["greedy_response"] for row in rows] == [t for _, t in _reference_greedy(model)]
    for row, (prompt, label) in zip(rows, PROMPTS, strict=True):
        assert len(row["sample_responses"]) == 4
        rescored = [
            digit_fraction(RewardSample(prompt=prompt, response=text, label=label))
            for text in row["sample_responses"]
        ]
        assert rescored == pytest.approx(row["sample_scores"])
    # the model-loading bars of transformers are not drawn by every rank (stderr is no terminal
    # here: by none), and the console names what it evaluated
    assert "Loading weights" not in done.stderr
    assert f"evaluating the model folder {model}" in done.stdout.splitlines()
    assert len(set(reference)) > 1  # scores that vary: the comparison can tell prompts apart
    metrics = report["metrics"]
    expected = _summary(rows, 4, (1, 2, 4))
    assert 0 < expected["mean@4"] < 1  # some prompts' samples are right, some wrong
    assert {name: metrics[name] for name in expected} == pytest.approx(expected)
    assert metrics["prompts"] == len(PROMPTS)
    for label in ("small", "large"):
        mine = [row for row in rows if row["label"] == label]
        got = report["per_label"][label]
        assert {name: got[name] for name in expected} == pytest.approx(_summary(mine, 4, (1, 2, 4)))
    # the table: a header naming the metrics, then the rows all, large, small
    lines = [line.split() for line in done.stdout.splitlines()]
    header = next(i for i, line in enumerate(lines) if line[:2] == ["label", "prompts"])
    assert [line[0] for line in lines[header + 1 : header + 4]] == ["all", "large", "small"]
    assert "pass@4" in lines[header]


def test_eval_of_a_checkpoint_scores_as_the_model_exported_from_it(
    inputs: tuple[Path, Path], tmp_path: Path
) -> None:
    model, data = inputs
    train, held_out = make_prompt_files(tmp_path / "data")
    save = tmp_path / "run"
    args = base_args(model, train, held_out, save)
    args = [a for a in args if not a.startswith("--eval_dataset")]
    _lrft([*args, "--max_steps=1", "--save_steps=1", "--rollout_batch_size=2"], ranks=1)
    checkpoints = save / "checkpoints"
    assert (checkpoints / "global_step1").is_dir()
    scores = {}
    for name, target in [("checkpoint", checkpoints), ("export", save / "hf_model")]:
        report = tmp_path / f"{name}.json"
        done = _lrft(_eval_args(target, data, report), ranks=1)
        loaded = json.loads(report.read_text())
        scores[name] = [row["greedy_score"] for row in loaded["per_prompt"]]
        if name == "checkpoint":
            assert loaded["checkpoint"] == str(checkpoints / "global_step1")
            chosen = (
                f"evaluating checkpoint {checkpoints / 'global_step1'} (the newest in "
                f"{checkpoints}), over its base model {model}"
            )
            assert chosen in done.stdout.splitlines()
    assert scores["checkpoint"] == scores["export"]
    assert scores["export"] == pytest.approx(_reference_greedy_scores(save / "hf_model"))
