"""On-policy distillation and process rewards under packing, sequence parallelism and the split
placement, against the same hand computation as ``test_distill_ranks.py``.

- packed rows, and the two ranks as one sequence-parallel group: the teacher is scored by the
  reference model's packed (and split) forward and still equals a plain transformers forward;
  the process reward model scores each rank's own rows packed into one; the advantages are
  GRPO's of the outcome plus the step scores, plus ``-coef * clamp(student - teacher)``;
- split placement on three ranks (two train, one rolls out): the trainer ranks hold the teacher
  and the process reward model and score each batch as it arrives, with the same advantages;
  with ``--no_task_reward`` the rollout rank scores nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lrft.cli import config_from_args
from lrft.dist import SplitLayout
from lrft.models.packed_attention import PACKED_ATTENTION
from lrft.testing.distributed import (
    DistributedSuite,
    RankPool,
    current_split_groups,
    shared_pool,
)
from lrft.trainer.split_build import build_job
from lrft.trainer.trainer import RLTrainer
from tests.trainer.fixtures import base_args, rank_info
from tests.trainer.test_distill_ranks import (
    COEF,
    HYBRID,
    SEPARATOR,
    checked_experience,
    process_model,
    recorded_teacher,
    write_inputs,
)
from tests.trainer.test_trainer_ranks import _trainer

SPLIT_PLACEMENT = ["--placement=split", "--rollout_world_size=1", "--weight_sync=broadcast"]
LAYOUT = SplitLayout(world_size=3, rollout_world_size=1)


def _teacher_and_process(root: Path) -> list[str]:
    return [
        f"--teacher_pretrain={root / 'teacher'}",
        f"--prm_pretrain={root / 'prm'}",
        f"--prm_step_separator={SEPARATOR}",
    ]


def packed_iteration(root: Path, layout: list[str]) -> dict[str, Any]:
    trainer = _trainer(root, [*HYBRID, *_teacher_and_process(root), *layout])
    seen = recorded_teacher(trainer)
    teacher_config: Any = seen.teacher.model.module.config
    prm = process_model(trainer)
    prm_config: Any = prm.model.module.config
    trainer.colocation.sync(version=0)
    metrics = trainer.train_step()
    return {
        **checked_experience(root, trainer, seen, coef=COEF, hybrid=True, process=True),
        "attention": [teacher_config._attn_implementation, prm_config._attn_implementation],
        "prm_packed": prm.layout.packed,
        "prm_split": prm.layout.group is not None,
        "steps": metrics["process/steps"],
    }


def split_run(root: Path, flags: list[str], hybrid: bool) -> dict[str, Any]:
    """One step of a split job; the trainer ranks check their experience by hand."""
    data = root / "data"
    args = base_args(root / "model", data / "train.jsonl", data / "eval.jsonl", root / "out")
    config = config_from_args([*args, *SPLIT_PLACEMENT, "--max_steps=1", *flags])
    job = build_job(config, rank_info(), groups=current_split_groups())
    if not isinstance(job, RLTrainer):
        return {"role": "rollout", "steps": job.fit().steps}
    seen = recorded_teacher(job)
    process = hybrid and process_model(job) is not None
    result = job.fit()
    checked = checked_experience(root, job, seen, coef=COEF, hybrid=hybrid, process=process)
    return {"role": "train", "steps": result.steps, **checked}


class TestDistillationLayouts(DistributedSuite):
    world_size = 2

    @pytest.mark.parametrize(
        "layout",
        [["--packing_samples"], ["--packing_samples", "--sequence_parallel_size=2"]],
        ids=["packed", "sequence-parallel"],
    )
    def test_teacher_and_process_rewards_on_packed_rows(
        self, pool: RankPool, tmp_path: Path, layout: list[str]
    ) -> None:
        root = pool.shared_dir / tmp_path.name
        write_inputs(root)
        for result in pool.run(packed_iteration, root, layout):
            assert result["attention"] == [PACKED_ATTENTION, PACKED_ATTENTION]
            assert result["prm_packed"]
            assert not result["prm_split"]  # each rank scores its own rows
            assert result["steps"] >= 1.0
            assert result["plain_error"] < 2e-5
            assert result["advantage_error"] < 1e-5


def _split_flags(root: Path, hybrid: bool) -> list[str]:
    teacher = f"--teacher_pretrain={root / 'teacher'}"
    if not hybrid:  # pure distillation: the rollout rank scores nothing
        pure = ["--advantage_estimator=on_policy_distillation", f"--opd_kl_coef={COEF}"]
        return [*pure, teacher, "--no_task_reward"]
    # as HYBRID, less the engine's sleep: the trainer ranks hold no engine
    kept = [flag for flag in HYBRID if flag != "--enable_engine_sleep"]
    return [*kept, *_teacher_and_process(root)]


@pytest.mark.parametrize("hybrid", [True, False], ids=["hybrid-process-rewards", "no-task-reward"])
def test_the_split_placements_trainer_ranks_distil_and_score_steps(
    tmp_path: Path, hybrid: bool
) -> None:
    pool = shared_pool(LAYOUT.world_size, split=LAYOUT)
    root = pool.shared_dir / tmp_path.name
    write_inputs(root)
    results = pool.run(split_run, root, _split_flags(root, hybrid), hybrid)
    assert [r["role"] for r in results] == ["train", "train", "rollout"]
    assert [r["steps"] for r in results] == [1, 1, 1]
    for result in results[:2]:
        assert result["plain_error"] < 2e-5
        assert result["advantage_error"] < 1e-5
        if not hybrid:
            assert result["scores"] == [0.0] * len(result["scores"])
