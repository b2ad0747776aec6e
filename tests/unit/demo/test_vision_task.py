"""The vision demo's task: the answer is in the image and only there. Counted from the pixels (a
cell holds a shape when some pixel is brighter than any background shade), every image shows
its answer; every prompt's text is the same question; held-out images are none of the training
ones; the written files hold what the scenes drew."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

pytest.importorskip("PIL", reason="the vision demo draws its images with Pillow")

import numpy as np
from PIL import Image

from lrft.demos.vision.task import (
    CELL,
    GRID,
    MAX_SHAPES,
    QUESTION,
    SIZE,
    Scene,
    ShapeCountTask,
    write_problems,
)


def _cells_with_a_shape(image: Image.Image) -> int:
    # Backgrounds are shades below 40 per channel; shapes have every channel at 120 or more.
    pixels = np.asarray(image)
    assert pixels.shape == (SIZE, SIZE, 3)
    bright = pixels.min(axis=2) >= 120
    return sum(
        bool(bright[r * CELL : (r + 1) * CELL, c * CELL : (c + 1) * CELL].any())
        for r in range(GRID)
        for c in range(GRID)
    )


def _digest(scene: Scene) -> str:
    return hashlib.blake2b(scene.image().tobytes(), digest_size=16).hexdigest()


def test_every_image_shows_its_answer_and_nothing_else_does() -> None:
    task = ShapeCountTask(num_train=300, num_eval=100)
    scenes = [*task.train_scenes(), *task.eval_scenes()]
    for scene in scenes:
        assert _cells_with_a_shape(scene.image()) == int(scene.answer)
    answers = {scene.answer for scene in scenes}
    assert answers == {str(n) for n in range(1, MAX_SHAPES + 1)}


def test_held_out_images_are_not_training_images() -> None:
    task = ShapeCountTask(num_train=400, num_eval=100)
    train = {_digest(scene) for scene in task.train_scenes()}
    assert not train & {_digest(scene) for scene in task.eval_scenes()}


def test_written_rows_ask_one_question_of_their_images(tmp_path: Path) -> None:
    scenes = ShapeCountTask(num_train=8, num_eval=4).eval_scenes()
    path = write_problems(tmp_path / "eval.jsonl", scenes, stem="eval")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [row["input"] for row in rows] == [QUESTION] * len(scenes)
    for row, scene in zip(rows, scenes, strict=True):
        assert row["answer"] == scene.answer
        [name] = row["images"]
        with Image.open(tmp_path / name) as written:
            assert written.tobytes() == scene.image().tobytes()
