"""The HTML pages of saved trajectories with images: what a page shows, and a resumed run's
clean-up of the pages of later steps."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from lrft.api import MediaInputs
from lrft.data import PromptSample
from lrft.trainer.trajectories import TrajectoryWriter, trajectory_file
from lrft.trainer.trajectory_pages import INDEX, group_pictures, page_file, write_page


def _record(group: int, sample: int, reward: float) -> dict[str, Any]:
    return {
        "rank": 0,
        "group": group,
        "sample": sample,
        "prompt_index": 10 + group,
        "prompt": "<|vision_start|><|image_pad|><|vision_end|>how many <shapes>?=",
        "response": f"{sample + 2}<|endoftext|>",
        "reference": "3",
        "reward": reward,
        "advantage": reward - 0.5,
    }


def test_a_page_shows_each_groups_images_prompt_responses_and_rewards(tmp_path: Path) -> None:
    red = Image.new("RGB", (84, 84), (200, 0, 0))
    blue = torch.zeros(3, 28, 28, dtype=torch.uint8)
    blue[2] = 255
    prompts = [
        PromptSample(prompt_text="a", prompt_token_ids=(1,), media=MediaInputs(images=[red])),
        PromptSample(prompt_text="b", prompt_token_ids=(1,), media=MediaInputs(images=[blue])),
    ]
    pictures = group_pictures(prompts)
    decoded = [Image.open(io.BytesIO(base64.b64decode(p[0]))) for p in pictures]
    assert decoded[0].getpixel((5, 5)) == (200, 0, 0)
    assert decoded[1].getpixel((5, 5)) == (0, 0, 255)
    records = [_record(g, s, float(s == 1)) for g in range(2) for s in range(2)]
    page = write_page(tmp_path, 7, records, pictures)
    assert page == page_file(tmp_path, 7)
    text = page.read_text()
    assert text.count("<img ") == 2
    assert pictures[0][0] in text
    assert pictures[1][0] in text
    assert html.escape("how many <shapes>?=") in text  # prompts are escaped, not markup
    assert text.count("<td>1.000</td>") == 2  # the rewarded sample of each group
    assert "prompt row 11" in text
    assert page.name in (tmp_path / INDEX).read_text()


def test_resuming_removes_the_pages_of_later_steps(tmp_path: Path) -> None:
    writer = TrajectoryWriter(tmp_path, every=1, rank=0)
    picture = group_pictures(
        [
            PromptSample(
                prompt_text="a",
                prompt_token_ids=(1,),
                media=MediaInputs(images=[Image.new("RGB", (4, 4))]),
            )
        ]
    )
    for step in (1, 2, 3):
        writer.write(step, [_record(0, 0, 1.0)], picture)
    assert all(page_file(tmp_path, step).exists() for step in (1, 2, 3))
    assert writer.discard_after(1) == [2, 3]
    kept = sorted(path.name for path in tmp_path.glob("step_*"))
    assert kept == sorted([trajectory_file(tmp_path, 1).name, page_file(tmp_path, 1).name])
    index = (tmp_path / INDEX).read_text()
    assert page_file(tmp_path, 1).name in index
    assert page_file(tmp_path, 2).name not in index


def test_text_only_steps_get_no_page(tmp_path: Path) -> None:
    writer = TrajectoryWriter(tmp_path, every=1, rank=0)
    writer.write(1, [_record(0, 0, 1.0)], [[]])
    assert trajectory_file(tmp_path, 1).exists()
    assert not page_file(tmp_path, 1).exists()
    assert not (tmp_path / INDEX).exists()
