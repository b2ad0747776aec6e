"""Multi-turn episodes on NCCL/CUDA: ``torchrun --nproc_per_node 1 -m lrft train --environment
...`` with FSDP2 and with DeepSpeed ZeRO-3, through the hf engine's CUDA decoding paths (the
CUDA-graph replay and the compiled step), where an episode's later turns are prefilled from the
tokens of its earlier turns and the environment's observation.

The CPU twins (``tests/trainer/test_episode_torchrun.py``) run the same flags on gloo; here the
static KV cache, the graph replay and bf16 weights are on the path. Every saved score is
recomputed from the saved texts, by the same checks as there. Skipped with a reason where no CUDA device is visible
(CI has none) or DeepSpeed is missing for the ZeRO-3 case.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.trainer.fixtures import base_args, make_model_folder, make_prompt_files
from tests.trainer.test_episode_torchrun import EPISODES, check_relay_run

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (the GPU directory runs there)"
)


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

    # 4 prompts x 4 samples in each of the 2 steps, on the one rank
    check_relay_run(save, model, samples=2 * 4 * 4)
