"""A log gets lines, never bars: ``torchrun --nproc_per_node 2 -m lrft train`` with stdout and
stderr redirected to one file holds no carriage-return frame from any rank or phase (model
loading, rollouts, evaluation, the Hugging Face export)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.trainer.fixtures import base_args, make_model_folder, make_prompt_files
from tests.trainer.test_torchrun import ROOT, _command, _env


def bar_frames(text: str) -> list[str]:
    """The lines of ``text`` a bar redrew with a carriage return (a CRLF line end is none)."""
    return [line for line in text.split("\n") if "\r" in line.removesuffix("\r")]


def test_a_redirected_run_writes_no_progress_bar_frames(tmp_path: Path) -> None:
    train, held_out = make_prompt_files(tmp_path / "data")
    model = make_model_folder(tmp_path / "model")
    log = tmp_path / "train.log"
    args = [*base_args(model, train, held_out, tmp_path / "out"), "--max_steps=2"]
    with log.open("wb") as sink:
        done = subprocess.run(
            _command(args),
            # this tree's lrft first, not whichever one the environment's install points at
            env=_env(PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)])),
            stdout=sink,
            stderr=subprocess.STDOUT,
            timeout=300,
        )
    text = log.read_bytes().decode("utf-8", errors="replace")
    assert done.returncode == 0, text[-3000:]
    # every phase ran and said so, in plain lines
    for line in ("eval at step 0:", "step 1/2  reward ", "step 2/2  reward ", "eval at step 2:"):
        assert line in text
    assert "Hugging Face model written to" in text
    # before, each rank's "Loading weights" bars and the export's "Writing model shards" bar
    # redrew themselves here with carriage returns
    frames = bar_frames(text)
    assert frames == [], frames[:3]
