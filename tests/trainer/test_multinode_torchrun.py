"""``lrft train`` as two nodes of one process each, on localhost: two torchrun launchers meet
through c10d rendezvous (``--nnodes 2 --rdzv_backend c10d``) as they would on two machines, and
train, checkpoint and export as one job."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from lrft.run.checkpoint import read_manifest
from tests.trainer.fixtures import base_args, make_model_folder, make_prompt_files
from tests.trainer.test_torchrun import _kill_job

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_two_nodes_of_one_process_train_as_one_job(tmp_path: Path) -> None:
    model = make_model_folder(tmp_path / "model")
    train, held_out = make_prompt_files(tmp_path / "data")
    save = tmp_path / "out"
    args = [*base_args(model, train, held_out, save), "--max_steps=2", "--save_steps=2"]
    endpoint = f"127.0.0.1:{_free_port()}"
    launcher = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
        "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint, "--rdzv_id", f"job{os.getpid()}",
    ]  # fmt: skip
    paths = [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, paths)), OMP_NUM_THREADS="1")
    nodes = [
        subprocess.Popen(
            [*launcher, "-m", "lrft", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = []
    try:
        for node in nodes:
            out, _ = node.communicate(timeout=300)
            outputs.append(out)
    finally:
        for node in nodes:
            if node.poll() is None:
                _kill_job(node.pid)  # torchrun's workers run in sessions of their own
    for node, out in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, out[-4000:]
    records = [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2]
    manifest = read_manifest(save / "checkpoints" / "global_step2")
    assert manifest["world_size"] == 2  # one job of two ranks, not two jobs of one
    assert (save / "hf_model" / "model.safetensors").is_file()
