"""``torchrun --nproc_per_node 2 -m lrft train --demo calculator``, briefly: the shipped warmed-up
model plays episodes with the calculator on two gloo ranks for one GRPO iteration, and the
saved turns show calls whose tool output is the true sum, scored by the exact-answer rule."""

from __future__ import annotations

import json
import re
from pathlib import Path

from lrft.demos.task import is_correct
from tests.trainer.test_torchrun import _run


def test_the_calculator_demo_plays_episodes_with_the_tool(tmp_path: Path) -> None:
    save = tmp_path / "out"
    done = _run(
        [
            "train",
            "--demo=calculator",
            f"--save_path={save}",
            "--max_steps=1",
            "--eval_steps=1",
            "--eval_max_samples=8",
            "--rollout_batch_size=4",
            "--micro_rollout_batch_size=4",
            "--train_batch_size=32",
            "--micro_train_batch_size=16",
            "--save_trajectories",
            "--no-save_hf_model",
        ]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"held-out accuracy \d\.\d+ -> \d\.\d+", done.stdout), done.stdout[-2000:]
    records = [
        json.loads(line)
        for line in (save / "trajectories" / "step_00000001.jsonl").read_text().splitlines()
    ]
    assert len(records) == 4 * 8  # every sample of every rank's prompts
    calls = 0
    for record in records:
        a, b = (int(x) for x in record["prompt"].removesuffix("=").split("+"))
        assert 100 <= a <= 999
        assert 100 <= b <= 999
        turns = record["turns"]
        call = re.search(r"<calculator>(\d+)\+(\d+)</calculator>", turns[0]["model"])
        if call is not None and len(turns) == 2:
            calls += 1
            x, y = (int(v) for v in call.groups())
            assert turns[0]["observation"] == f"\n{x + y}\n"  # the tool computed the sum
        assert record["reward"] == float(is_correct(turns[-1]["model"], str(a + b)))
    assert calls > 0  # the warmed-up model calls on some problems
