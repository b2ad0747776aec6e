"""Loading a causal-LM folder as a scalar reward model: the new score head is announced in one
line instead of transformers' MISSING report, which still shows when anything else is off."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from lrft.demos.model import ASSETS_DIR, load_tokenizer
from lrft.models.scalar_head import TRANSFORMERS_LOAD_LOGGER
from lrft.rm.model import load_scalar_rm


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def reports() -> Iterator[list[str]]:
    """What transformers' loading logger lets through (a handler runs after its filters)."""
    logger = logging.getLogger(TRANSFORMERS_LOAD_LOGGER)
    handler = _Records()
    logger.addHandler(handler)
    yield handler.messages
    logger.removeHandler(handler)


def test_a_new_score_head_is_announced_in_one_line_not_reported_missing(
    reports: list[str],
) -> None:
    said: list[str] = []
    model, _ = load_scalar_rm(str(ASSETS_DIR), load_tokenizer(), seed=3, announce=said.append)
    assert said == [
        f"the score head is new (pretrain {str(ASSETS_DIR)!r} has none): its weights start "
        "small, from seed 3; every backbone weight loaded"
    ]
    assert not [m for m in reports if "LOAD REPORT" in m]
    # the backbone is the folder's, the head starts small
    weights = load_file(ASSETS_DIR / "model.safetensors")
    loaded = dict(model.named_parameters())
    assert torch.equal(loaded["model.embed_tokens.weight"], weights["model.embed_tokens.weight"])
    assert loaded["score.weight"].abs().max() < 0.1


def test_a_report_of_anything_else_is_shown_as_transformers_wrote_it(
    tmp_path: Path, reports: list[str]
) -> None:
    folder = tmp_path / "extra"
    shutil.copytree(ASSETS_DIR, folder)
    weights = load_file(folder / "model.safetensors")
    weights["model.stray.weight"] = torch.zeros(2)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    said: list[str] = []
    load_scalar_rm(str(folder), load_tokenizer(), seed=3, announce=said.append)
    shown = [m for m in reports if "LOAD REPORT" in m]
    assert len(shown) == 1
    assert "model.stray.weight" in shown[0]
    assert "score.weight" in shown[0]
    assert len(said) == 1  # the head is still new, and said so
