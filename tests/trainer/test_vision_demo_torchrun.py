"""``torchrun --nproc_per_node 2 -m lrft train --demo vision``, briefly: the shipped tiny Qwen2-VL
trains two GRPO iterations on the shape-counting images over two gloo ranks, evaluates on held-out
images, exports a folder that loads as an image-text-to-text model with its processor, and saves
trajectories whose HTML page shows each group's image with its prompt, responses and rewards."""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path

import pytest

pytest.importorskip("PIL", reason="the vision demo draws its images with Pillow")

from PIL import Image

from tests.trainer.test_torchrun import _run

STEPS = 2


def test_the_vision_demo_trains_and_saves_pages_with_images(tmp_path: Path) -> None:
    save = tmp_path / "out"
    done = _run(
        [
            "train",
            "--demo=vision",
            f"--save_path={save}",
            f"--max_steps={STEPS}",
            f"--eval_steps={STEPS}",
            "--eval_max_samples=16",
            "--rollout_batch_size=8",
            "--micro_rollout_batch_size=8",
            "--train_batch_size=64",
            "--micro_train_batch_size=16",
            "--save_trajectories",
        ]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = re.search(r"held-out accuracy (\d\.\d+) -> (\d\.\d+)", done.stdout)
    assert summary is not None, done.stdout[-2000:]
    assert (save / "curves.png").is_file()

    from transformers import AutoModelForImageTextToText, Qwen2VLProcessor

    from lrft.data.processor import load_processor

    exported = save / "hf_model"
    model = AutoModelForImageTextToText.from_pretrained(exported)
    assert type(model).__name__ == "Qwen2VLForConditionalGeneration"
    assert (exported / "preprocessor_config.json").is_file()
    # the checkpoint's own processor class (built without its video processor, which needs
    # torchvision)
    assert isinstance(load_processor(exported), Qwen2VLProcessor)

    trajectories = save / "trajectories"
    records = [
        json.loads(line)
        for line in (trajectories / f"step_{STEPS:08d}.jsonl").read_text().splitlines()
    ]
    assert records
    assert all(record["images"] for record in records)  # each names where its image came from
    page = (trajectories / f"step_{STEPS:08d}.html").read_text()
    pictures = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    groups = {(record["rank"], record["group"]) for record in records}
    assert len(pictures) == len(groups)  # one image per prompt in the demo
    with Image.open(io.BytesIO(base64.b64decode(pictures[0]))) as picture:
        assert picture.size == (84, 84)
    for record in records[:4]:
        assert f"<pre>{record['response']}</pre><td>{record['reward']:.3f}</td>" in page.replace(
            "</pre></td><td>", "</pre><td>"
        )
    assert "step_00000002.html" in (trajectories / "index.html").read_text()
