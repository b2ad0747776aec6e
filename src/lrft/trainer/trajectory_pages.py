"""Saved trajectories as static HTML pages, for prompts with images: the images, the prompt, and
each sampled response with its reward and advantage.

Written next to the JSONL files of :mod:`lrft.trainer.trajectories` when an iteration's prompts
hold images: ``step_<k>.html`` per saved iteration (every group of every rank, the group's
images embedded as PNG data, so the page opens anywhere on its own) and ``index.html`` linking
them. One page is a few hundred kilobytes for the vision demo's 32 groups of 8 responses.
"""

from __future__ import annotations

import base64
import html
import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from lrft.api.media import Image
from lrft.data import PromptSample

INDEX = "index.html"

_STYLE = """
body { font-family: sans-serif; margin: 1.5em; }
.group { border-top: 1px solid #ccc; padding: 0.8em 0; display: flex; gap: 1.2em; }
.group img { width: 168px; image-rendering: pixelated; border: 1px solid #999; }
pre { white-space: pre-wrap; margin: 0.2em 0; }
table { border-collapse: collapse; }
td, th { padding: 0.15em 0.6em; text-align: left; }
.good { background: #dfd; }
"""


def page_file(directory: Path, step: int) -> Path:
    return directory / f"step_{step:08d}.html"


def _png(image: Image) -> str:
    from PIL import Image as PILImage

    # a PIL image, or a uint8 (channels, height, width) tensor
    picture = (
        PILImage.fromarray(image.permute(1, 2, 0).numpy())
        if isinstance(image, torch.Tensor)
        else image
    )
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def group_pictures(prompts: Sequence[PromptSample]) -> list[list[str]]:
    """Each prompt's images as base64 PNG, in prompt order (for :func:`write_page`)."""
    return [[] if p.media is None else [_png(image) for image in p.media.images] for p in prompts]


def has_pictures(pictures: Sequence[Sequence[str]]) -> bool:
    return any(pictures)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return html.escape("" if value is None else str(value))


def write_page(
    directory: Path,
    step: int,
    records: Sequence[dict[str, Any]],
    pictures: Sequence[Sequence[str]],
) -> Path:
    """``step``'s page: ``pictures[i]`` are the images of the ``i``-th group of ``records``
    (groups in the order their records come, rank by rank); then the index. Written under a
    temporary name and renamed."""
    groups: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for record in records:
        groups.setdefault((record["rank"], record["group"]), []).append(record)
    if len(groups) != len(pictures):
        raise ValueError(f"{len(pictures)} groups of pictures for {len(groups)} groups")
    parts = [
        f"<!doctype html><meta charset='utf-8'><title>step {step}</title><style>{_STYLE}</style>",
        f"<h1>Step {step}</h1><p><a href='{INDEX}'>all steps</a></p>",
    ]
    for ((rank, group), samples), pngs in zip(groups.items(), pictures, strict=True):
        images = "".join(
            f"<img alt='image {k}' src='data:image/png;base64,{png}'>" for k, png in enumerate(pngs)
        )
        parts.append(_group(rank, group, samples, images))
    final = page_file(directory, step)
    temporary = directory / f".tmp-{final.name}"
    temporary.write_text("".join(parts), encoding="utf-8")
    os.replace(temporary, final)
    write_index(directory)
    return final


def _group(rank: int, group: int, samples: Sequence[dict[str, Any]], images: str) -> str:
    first = samples[0]
    rows = "".join(
        f"<tr class='{'good' if (s['reward'] or 0) > 0 else ''}'><td>{s['sample']}</td>"
        f"<td><pre>{_cell(s['response'])}</pre></td><td>{_cell(s['reward'])}</td>"
        f"<td>{_cell(s['advantage'])}</td></tr>"
        for s in samples
    )
    return (
        f"<div class='group'><div>{images}</div><div>"
        f"<p>rank {rank}, group {group}, prompt row {first['prompt_index']}; reference "
        f"<b>{_cell(first['reference'])}</b></p><pre>{_cell(first['prompt'])}</pre>"
        f"<table><tr><th>sample</th><th>response</th><th>reward</th><th>advantage</th></tr>"
        f"{rows}</table></div></div>"
    )


def write_index(directory: Path) -> None:
    """``index.html``: a link to every step's page (removed when no page is left)."""
    pages = sorted(directory.glob("step_*.html"))
    if not pages:
        (directory / INDEX).unlink(missing_ok=True)
        return
    links = "".join(f"<li><a href='{p.name}'>{p.stem}</a></li>" for p in pages)
    text = (
        f"<!doctype html><meta charset='utf-8'><title>trajectories</title>"
        f"<style>{_STYLE}</style><h1>Saved trajectories</h1><ul>{links}</ul>"
    )
    temporary = directory / f".tmp-{INDEX}"
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, directory / INDEX)
