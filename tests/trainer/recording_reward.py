"""The demo's exact-answer reward, also writing what it scored to one JSON line per call and rank:
a backdoor for trainer tests to read back what the engine generated (importable as
``tests.trainer.recording_reward:recorded_exact``). Each rank's last line is the final evaluation.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import attrs

from lrft.demos import exact_answer
from lrft.rewards import RewardOutput, RewardSample

RECORD_DIR_ENV = "LRFT_TEST_RECORD_DIR"


@attrs.frozen(kw_only=True)
class RecordingExactAnswer:
    """Scores as the demo does; appends ``{"prompts": [...], "responses": [...]}`` to
    ``$LRFT_TEST_RECORD_DIR/rank{RANK}.jsonl``."""

    name: str = "recorded_exact"

    def __call__(self, samples: Sequence[RewardSample], /) -> RewardOutput:
        record = {
            "prompts": [sample.prompt for sample in samples],
            "responses": [sample.response for sample in samples],
        }
        path = Path(os.environ[RECORD_DIR_ENV]) / f"rank{os.environ['RANK']}.jsonl"
        with path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")
        return RewardOutput(scores=[exact_answer(sample) for sample in samples])


def last_record(directory: Path, rank: int) -> dict[str, list[str]]:
    """Rank ``rank``'s last recorded call."""
    lines = (directory / f"rank{rank}.jsonl").read_text(encoding="utf-8").splitlines()
    record: dict[str, list[str]] = json.loads(lines[-1])
    return record


recorded_exact = RecordingExactAnswer()
