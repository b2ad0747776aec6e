"""Multi-turn episodes on NCCL/CUDA: ``torchrun --nproc_per_node 1 -m lrft train --environment
...`` with FSDP2 and with DeepSpeed ZeRO-3, through the hf engine's CUDA decoding paths (the
CUDA-graph replay and the compiled step), where an episode's later turns are prefilled from the
tokens of its earlier turns and the environment's observation.

The CPU twins (``tests/trainer/test_episode_torchrun.py``) run the same flags on gloo; here the
static KV cache, the graph replay and bf16 weights are on the path. Every saved score is
recomputed from the saved texts, as there. Skipped with a reason where no CUDA device is visible
(CI has none) or DeepSpeed is missing for the ZeRO-3 case.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lrft.rewards import RewardSample
from lrft.trainer.trajectories import read_trajectories
from tests.trainer.episode_env import FIRST_TURN_REWARD, OBSERVATION
from tests.trainer.fixtures import base_args, digit_fraction, make_model_folder, make_prompt_files

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (the GPU directory runs there)"
)

EPISODES = [
    "--environment=tests.trainer.episode_env:Relay",
    "--max_turns=3",
    "--max_episode_tokens=32",
    "--save_trajectories",
    "--use_tis",
    "--init_kl_coef=0.01",
    "--max_steps=2",
]


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1"]
    command += ["--master_port", str(29300 + os.getpid() % 300), "-m", "lrft", *args]
    paths = [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, paths)))
    return subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=600, check=False
    )


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("episode_inputs")
    train, held_out = make_prompt_files(root / "data")
    return make_model_folder(root / "model"), train, held_out


# The compiled step is the same graph under either backend: ZeRO-3 runs the graph replay only.
@pytest.mark.parametrize(
    ("backend", "decode"),
    [([], "cuda_graph"), ([], "compiled"), (["--zero_stage=3"], "cuda_graph")],
    ids=["fsdp2-cuda_graph", "fsdp2-compiled", "zero3-cuda_graph"],
)
def test_episodes_train_on_a_gpu(
    inputs: tuple[Path, Path, Path], tmp_path: Path, backend: list[str], decode: str
) -> None:
    if backend and importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed: pip install 'lrft[deepspeed]'")
    model, train, held_out = inputs
    save = tmp_path / "out"
    result = _run(
        [*base_args(model, train, held_out, save), *EPISODES, *backend, f"--hf_decode={decode}"]
    )
    assert result.returncode == 0, result.stderr[-4000:]

    records = read_trajectories(save / "trajectories")
    assert records, "no trajectories were saved"
    for record in records:
        first, last = record["turns"]
        assert record["episode_end"] == "done"
        assert first["observation"] == OBSERVATION
        assert first["reward"] == FIRST_TURN_REWARD
        assert record["response"] == first["model"] + OBSERVATION + last["model"]
        expected = FIRST_TURN_REWARD + digit_fraction(
            RewardSample(prompt="", response=last["model"])
        )
        assert record["reward"] == pytest.approx(expected)

    rows = [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]
    train_rows = [row for row in rows if row["kind"] == "train"]
    assert [row["step"] for row in train_rows] == [1, 2]
    for row in train_rows:
        assert row["episode/turns"] == 2.0
        assert math.isfinite(row["policy/policy_loss"])
        assert math.isfinite(row["kl"])

    exported = load_file(save / "hf_model" / "model.safetensors")
    initial = load_file(model / "model.safetensors")
    # The export may be in the run's bf16: compare against the initial weights in that dtype.
    changed = [k for k in initial if not torch.equal(exported[k], initial[k].to(exported[k].dtype))]
    assert changed, "training did nothing"
