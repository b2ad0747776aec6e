"""A third-party backend package chosen from the command line: the example package
(``examples/lrft-example-backend``) is built and pip-installed into a folder of its own, and
``lrft train --engine_type example --train_backend example --weight_sync example`` under torchrun
trains with its three backends, found through their entry points, with no lrft code naming
them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.trainer.fixtures import base_args, make_model_folder, make_prompt_files

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "lrft-example-backend"


def _install_example(target: Path, scratch: Path) -> None:
    """``pip install`` of the example's wheel into ``target`` (its entry points included)."""
    source = shutil.copytree(
        EXAMPLE, scratch / "source", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    wheels = scratch / "wheels"
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(source)],
        check=True,
        capture_output=True,
    )
    [wheel] = wheels.glob("lrft_example_backend-*.whl")
    subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
    )


def test_lrft_train_trains_with_an_installed_packages_backends(tmp_path: Path) -> None:
    pytest.importorskip("setuptools", reason="building the example's wheel needs setuptools")
    site = tmp_path / "site"
    _install_example(site, tmp_path / "build")
    assert (site / "lrft_example_backend" / "engine.py").is_file()
    train, held_out = make_prompt_files(tmp_path / "data")
    model = make_model_folder(tmp_path / "model")
    save = tmp_path / "out"
    args = [
        *base_args(model, train, held_out, save),
        "--engine_type=example",
        "--train_backend=example",
        "--weight_sync=example",
        "--max_steps=2",
        "--save_steps=-1",
    ]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1"]
    port = str(29900 + os.getpid() % 90)
    paths = [str(ROOT / "src"), str(ROOT), str(site)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [*torchrun, "--master_port", port, "-m", "lrft", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    # the names come from the built objects themselves (backend.name, engine.name)
    assert "backends: train example, engine example, weight sync example" in output, output
    steps = [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in steps if record["kind"] == "train"] == [1, 2]
    # the example's train backend (FSDP2 inside) moved the weights it exported
    before = load_file(model / "model.safetensors")
    after = load_file(save / "hf_model" / "model.safetensors")
    assert any(not torch.equal(before[name], after[name]) for name in before)


def test_a_backend_name_no_package_registers_is_refused_before_any_rank_starts(
    tmp_path: Path,
) -> None:
    train, held_out = make_prompt_files(tmp_path / "data")
    args = [*base_args(tmp_path / "model", train, held_out, tmp_path / "out"), "--engine_type=x"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    done = subprocess.run(
        [sys.executable, "-m", "lrft", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert "invalid choice: 'x'" in done.stderr or "engine_type 'x' is unknown" in done.stderr
