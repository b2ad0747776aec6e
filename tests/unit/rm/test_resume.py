"""What a resumed ``lrft train-rm`` may change: the run's length and outputs, not what it
computes; a checkpoint of another command, of other examples, or with a decaying schedule of
another length is refused with the reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest

from lrft.api.errors import ConfigError
from lrft.rm import RMTrainConfig
from lrft.rm.config import RESUMABLE_RM_SETTINGS
from lrft.rm.trainer import COMMAND, check_resumable

CONFIG = RMTrainConfig(pretrain="m", dataset="d.jsonl", max_steps=10)
WHERE = Path("ck/global_step4")


def _manifest(config: RMTrainConfig = CONFIG, **changes: Any) -> dict[str, Any]:
    manifest = {
        "command": COMMAND,
        "config": config.as_dict(),
        "data_fingerprint": "abc",
        "schedule_steps": 10,
    }
    manifest.update(changes)
    return manifest


def test_length_outputs_and_evaluation_may_change() -> None:
    longer = attrs.evolve(
        CONFIG, max_steps=20, save_path="elsewhere", eval_steps=3, eval_dataset="e"
    )
    check_resumable(_manifest(), longer, WHERE, "abc", 20)
    assert {field.name for field in attrs.fields(RMTrainConfig)} >= RESUMABLE_RM_SETTINGS


@pytest.mark.parametrize(
    ("manifest", "config", "fingerprint", "steps", "message"),
    [
        (_manifest(command=None), CONFIG, "abc", 10, r"was not written by lrft train-rm"),
        (
            _manifest(),
            attrs.evolve(CONFIG, seed=1),
            "abc",
            10,
            r"seed 42 -> 1.*docs/reward-models.md",
        ),
        (
            _manifest(),
            attrs.evolve(CONFIG, learning_rate=1.0),
            "abc",
            10,
            r"learning_rate 1e-05 -> 1.0",
        ),
        (
            _manifest(),
            CONFIG,
            "xyz",
            10,
            r"written for other examples \(data fingerprint abc != xyz\)",
        ),
        (
            _manifest(attrs.evolve(CONFIG, lr_scheduler="cosine")),
            attrs.evolve(CONFIG, lr_scheduler="cosine", max_steps=20),
            "abc",
            20,
            r"decays its cosine LR schedule over 10 steps, this run over 20",
        ),
    ],
)
def test_a_resume_that_would_change_the_run_is_refused(
    manifest: dict[str, Any], config: RMTrainConfig, fingerprint: str, steps: int, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        check_resumable(manifest, config, WHERE, fingerprint, steps)
