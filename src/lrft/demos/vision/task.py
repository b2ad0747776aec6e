"""The vision demo's task: count the shapes drawn into a small image, checked exactly by a rule.

An image is ``GRID x GRID`` cells of ``CELL`` pixels (84 x 84: the tiny Qwen2-VL's processor
makes one image token of each cell), 1 to ``MAX_SHAPES`` of them holding a filled square or disc
of a random colour, size and offset on a background of a random dark shade. The prompt asks how
many shapes there are; the answer is the count, which only the image holds.

Images and problems come from one seeded generator, held-out first. With 9 cells there are only
511 layouts (which cells hold a shape), so layouts repeat between the sets; the images do not
(every shape's kind, size, offset and colour are drawn afresh), so held-out accuracy measures
counting unseen images. :func:`write_problems` writes the PNG files and a JSONL prompt file
whose ``images`` column holds paths relative to it, the layout ``lrft.data`` reads.

:func:`sloppy_count` is the teacher of the demo model's warm-up, who often says one more than
there is when there are several shapes (see ``scripts/make_vision_demo_model.py``).
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from lrft.api import validators as v

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

GRID = 3
CELL = 28
SIZE = GRID * CELL
"""The images' width and height in pixels."""
MAX_SHAPES = 5
QUESTION = "how many shapes?"
INPUT_KEY = "input"
IMAGES_KEY = "images"
REFERENCE_KEY = "answer"


@attrs.frozen(kw_only=True)
class Shape:
    """A filled ``kind`` (``square`` or ``disc``) of ``size`` pixels in cell ``cell``, offset by
    ``offset`` pixels from the cell's corner, in colour ``color``."""

    cell: int
    kind: str
    size: int
    offset: tuple[int, int]
    color: tuple[int, int, int]


@attrs.frozen(kw_only=True)
class Scene:
    """One image's shapes; ``seed`` draws its background's shade."""

    shapes: tuple[Shape, ...]
    seed: int

    @property
    def count(self) -> int:
        return len(self.shapes)

    @property
    def answer(self) -> str:
        return str(self.count)

    def image(self) -> PILImage:
        """The scene drawn: RGB, ``SIZE`` x ``SIZE``."""
        from PIL import Image, ImageDraw

        shade = random.Random(self.seed)
        background = (shade.randrange(40), shade.randrange(40), shade.randrange(40))
        image = Image.new("RGB", (SIZE, SIZE), background)
        draw = ImageDraw.Draw(image)
        for shape in self.shapes:
            row, column = divmod(shape.cell, GRID)
            left = column * CELL + shape.offset[0]
            top = row * CELL + shape.offset[1]
            box = (left, top, left + shape.size - 1, top + shape.size - 1)
            if shape.kind == "square":
                draw.rectangle(box, fill=shape.color)
            else:
                draw.ellipse(box, fill=shape.color)
        return image


def _scene(generator: random.Random) -> Scene:
    count = generator.randint(1, MAX_SHAPES)
    cells = generator.sample(range(GRID * GRID), count)
    shapes = []
    for cell in sorted(cells):
        size = generator.randint(12, 22)
        offset = (generator.randint(0, CELL - size), generator.randint(0, CELL - size))
        color = tuple(generator.randint(120, 255) for _ in range(3))
        shapes.append(
            Shape(
                cell=cell,
                kind=generator.choice(("square", "disc")),
                size=size,
                offset=offset,
                color=(color[0], color[1], color[2]),
            )
        )
    return Scene(shapes=tuple(shapes), seed=generator.randrange(2**31))


@attrs.frozen(kw_only=True)
class ShapeCountTask:
    """Seeded, disjoint training and held-out scenes."""

    num_train: int = attrs.field(default=2048, validator=v.positive_number)
    num_eval: int = attrs.field(default=200, validator=v.positive_number)
    seed: int = 0

    def _scenes(self) -> tuple[tuple[Scene, ...], tuple[Scene, ...]]:
        generator = random.Random(self.seed)
        held_out = tuple(_scene(generator) for _ in range(self.num_eval))
        train = tuple(_scene(generator) for _ in range(self.num_train))
        return train, held_out

    def train_scenes(self) -> tuple[Scene, ...]:
        return self._scenes()[0]

    def eval_scenes(self) -> tuple[Scene, ...]:
        return self._scenes()[1]


def sloppy_count(scene: Scene, generator: random.Random, *, overcount: float) -> str:
    """The warm-up teacher's answer: for two shapes or more, one too many with probability
    ``overcount``; a single shape it always counts right."""
    if scene.count >= 2 and generator.random() < overcount:
        return str(scene.count + 1)
    return scene.answer


def write_problems(path: str | os.PathLike[str], scenes: Iterable[Scene], *, stem: str) -> Path:
    """Write each scene as ``images/<stem>_<i>.png`` beside ``path`` and the JSONL rows
    (``input``, ``images`` relative to the file, ``answer``) to ``path``; returns ``path``."""
    path = Path(path)
    folder = path.parent / "images"
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for index, scene in enumerate(scenes):
        name = f"images/{stem}_{index:05d}.png"
        scene.image().save(path.parent / name)
        rows.append({INPUT_KEY: QUESTION, IMAGES_KEY: [name], REFERENCE_KEY: scene.answer})
    with path.open("w", encoding="utf-8") as file:
        for row in rows:
            file.write(json.dumps(row) + "\n")
    return path


def counts(scenes: Sequence[Scene]) -> list[int]:
    return [scene.count for scene in scenes]
