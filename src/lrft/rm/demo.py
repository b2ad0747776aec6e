"""The built-in demo of ``lrft train-rm`` (no ``--pretrain``): a scalar reward model that learns
to prefer the exact sum of two numbers to a sloppy one.

The model starts from the demo policy of ``lrft train`` (:mod:`lrft.demos`, a tiny Qwen2 that
often forgets carries) with a new score head. Each pair is an addition problem that carries, with
its exact sum as the chosen response and, as the rejected one, what the policy's sloppy teacher
says with at least one carry lost (:func:`lrft.demos.task.teacher_answers`). Those are the
policy's own mistakes (it answers problems without carries right), so the exported reward model
can drive ``lrft train --reward_pretrain`` on the demo task. Training and held-out pairs come
from the demo task's disjoint problem sets.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable
from pathlib import Path

import attrs

from lrft.demos.task import AdditionTask, Problem, teacher_answers
from lrft.rm.config import RMTrainConfig

DEMO_RM_SETTINGS: dict[str, object] = {
    "train_batch_size": 32,
    "micro_train_batch_size": 32,
    "learning_rate": 3e-4,
    "max_epochs": 3,
    "eval_steps": 50,
    "eval_max_samples": 200,
}
"""What ``lrft train-rm`` uses when no model is given, unless the command line says otherwise."""


def rejected_answer(problem: Problem, rng: random.Random) -> str:
    """A wrong answer the demo policy gives to ``problem`` (which carries): a carry lost."""
    wrong = sorted(teacher_answers(problem) - {problem.answer})
    if not wrong:
        raise ValueError(f"{problem.prompt} carries nowhere: the demo policy answers it right")
    return rng.choice(wrong)


def preference_rows(problems: Iterable[Problem], *, seed: int) -> list[dict[str, str]]:
    """Rows ``{"prompt", "chosen", "rejected"}`` for the problems that carry; the same seed gives
    the same rows."""
    rng = random.Random(seed)
    return [
        {"prompt": p.prompt, "chosen": p.answer, "rejected": rejected_answer(p, rng)}
        for p in problems
        if p.has_carry
    ]


def _write(path: Path, rows: list[dict[str, str]], rank: int) -> Path:
    # Every rank writes its own copy and renames it into place: same bytes, no race.
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.rank{rank}")
    temporary.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    os.replace(temporary, path)
    return path


def demo_rm_config(config: RMTrainConfig, rank: int) -> RMTrainConfig:
    """``config`` with the demo model and the preference files (written here, per rank)."""
    from lrft.demos.model import ASSETS_DIR

    task = AdditionTask()
    data_dir = Path(config.save_path) / "demo_data"
    train = _write(
        data_dir / "preferences.jsonl", preference_rows(task.train_problems(), seed=0), rank
    )
    held_out = _write(
        data_dir / "preferences_eval.jsonl", preference_rows(task.eval_problems(), seed=1), rank
    )
    return attrs.evolve(
        config, pretrain=str(ASSETS_DIR), dataset=str(train), eval_dataset=str(held_out)
    )
