"""Saved trajectories: every sample of an iteration as one JSON line (``--save_trajectories``).

Layout: ``SAVE_PATH/trajectories/step_<k>.jsonl`` (``k`` zero-padded to 8 digits), one file per
saved iteration holding every rank's samples, rank by rank: the ranks' records are gathered and
rank 0 writes them, so a file reads as the whole global batch of that iteration. A file is
written under a temporary name and renamed, so a file that exists is complete. A run that starts
at step ``k`` (0, or the step of the checkpoint it resumed from) first removes the files of later
steps: what an interrupted run saved after its last checkpoint is replaced by the resumed run's
own iterations, never kept twice.

One record per sample (:func:`sample_records`): ``step``, ``rank``, ``group`` (the prompt's
position in the rank's share of the batch: ``(step, rank, group)`` is one GRPO group),
``sample`` (0 to ``n - 1`` within the group), ``prompt_index`` (the prompt's row in the prompt
file), ``prompt`` and ``response`` texts, ``prompt_tokens`` and ``response_tokens``,
``finish_reason``, ``label`` and ``reference`` (as the reward saw them), ``reward`` (the reward
function's score, before any ``normalize_reward`` scaling), ``reward_metrics`` (the reward's named
per-sample values; ``null`` where not measured), ``advantage`` (the mean over the response's
tokens, which is the sequence's advantage for outcome estimators such as ``group_norm``),
``logprob`` (the response's summed log-probability under the behaviour policy), in the split
placement ``weight_version`` (the version of the weights that generated it) and ``staleness``
(how many versions it lagged the weights it trained), with a reference model ``kl`` (the mean per-token KL estimate against it) and, for a prompt with
images, ``images`` (where each came from, as the data names it), for one with audio clips
``audio`` (the same for its clips). An iteration whose prompts hold
images also gets a static HTML page showing each group's images, prompt and responses with their
rewards (:mod:`lrft.trainer.trajectory_pages`).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist

from lrft.algo import token_kl
from lrft.api.types import GenerationResult
from lrft.data import PromptSample
from lrft.dist import all_gather_objects
from lrft.rewards import RewardOutput
from lrft.trainer.experience import Decode, ExperienceBatch
from lrft.trainer.trajectory_pages import has_pictures, page_file, write_index, write_page

_NAME = re.compile(r"step_(\d+)\.jsonl")


def trajectory_file(directory: Path, step: int) -> Path:
    return directory / f"step_{step:08d}.jsonl"


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def sample_records(
    *,
    step: int,
    rank: int,
    prompts: Sequence[PromptSample],
    results: Sequence[GenerationResult],
    rewards: RewardOutput,
    experience: ExperienceBatch,
    decode: Decode,
    kl_estimator: str,
    trained_version: int | None = None,
) -> list[dict[str, Any]]:
    """One record per result (prompt-major, ``len(results) // len(prompts)`` per prompt); see
    the module docstring for the fields. ``trained_version``: the version of the weights the
    step trained, which the rows' ``experience.weight_versions`` lag."""
    if not prompts or len(results) % len(prompts):
        raise ValueError(
            f"{len(results)} results are not a whole number per {len(prompts)} prompts"
        )
    n = len(results) // len(prompts)
    mask = experience.sequences.action_mask
    tokens = mask.sum(-1).clamp(min=1)
    advantages = (experience.advantages * mask).sum(-1) / tokens
    old = experience.old_logprobs
    if old is None:
        raise ValueError(
            "trajectories record the behaviour logprobs: the trainer must compute them "
            "(it does whenever trajectories are saved)"
        )
    logprobs = (old * mask).sum(-1)
    kl = None
    if experience.ref_logprobs is not None:
        per_token = token_kl(old, experience.ref_logprobs, mask, kl_estimator)
        kl = per_token.sum(-1) / tokens
    records = []
    for i, result in enumerate(results):
        prompt = prompts[i // n]
        record: dict[str, Any] = {
            "step": step,
            "rank": rank,
            "group": i // n,
            "sample": result.sample_index,
            "prompt_index": prompt.source_index,
            "prompt": prompt.prompt_text,
            "response": decode(result.output_token_ids),
            "prompt_tokens": len(result.prompt_token_ids),
            "response_tokens": len(result.output_token_ids),
            "finish_reason": result.finish_reason,
            "label": _text(prompt.label),
            "reference": _text(prompt.reference),
            "reward": _finite(rewards.scores[i]),
            "reward_metrics": {
                name: _finite(values[i]) for name, values in rewards.metrics.items()
            },
            "advantage": _finite(float(advantages[i])),
            "logprob": _finite(float(logprobs[i])),
        }
        if experience.weight_versions is not None and trained_version is not None:
            version = int(experience.weight_versions[i])
            record["weight_version"] = version
            record["staleness"] = trained_version - version
        if kl is not None:
            record["kl"] = _finite(float(kl[i]))
        if prompt.images:
            record["images"] = [image.label for image in prompt.images]
        if prompt.audio:
            record["audio"] = [clip.label for clip in prompt.audio]
        records.append(record)
    return records


def trajectory_steps(directory: Path) -> list[int]:
    """The steps that have a trajectory file under ``directory``, ascending."""
    if not directory.is_dir():
        return []
    matches = (_NAME.fullmatch(path.name) for path in directory.iterdir())
    return sorted(int(match.group(1)) for match in matches if match)


def read_trajectories(directory: Path) -> list[dict[str, Any]]:
    """Every record under ``directory``, in step order."""
    records = []
    for step in trajectory_steps(directory):
        lines = trajectory_file(directory, step).read_text(encoding="utf-8").splitlines()
        records += [json.loads(line) for line in lines if line.strip()]
    return records


class TrajectoryWriter:
    """Writes the trajectory files of ``directory`` every ``every`` steps; see the module docstring.

    Every rank holds one; :meth:`write` is collective over the default group (each rank passes
    its own records), and only ``rank`` 0 touches files.
    """

    def __init__(self, directory: Path, *, every: int, rank: int) -> None:
        if every < 1:
            raise ValueError(f"every must be a positive number of steps, got {every}")
        self.directory = directory
        self.every = every
        self.rank = rank

    def due(self, step: int) -> bool:
        return step % self.every == 0

    def discard_after(self, step: int) -> list[int]:
        """Remove the files of steps after ``step`` (and unfinished writes); the removed steps."""
        if self.rank != 0 or not self.directory.is_dir():
            return []
        for leftover in self.directory.glob(".tmp-*"):
            leftover.unlink()
        later = [s for s in trajectory_steps(self.directory) if s > step]
        for later_step in later:
            trajectory_file(self.directory, later_step).unlink()
            page_file(self.directory, later_step).unlink(missing_ok=True)
        if later:
            write_index(self.directory)
        return later

    def write(
        self,
        step: int,
        records: list[dict[str, Any]],
        pictures: list[list[str]] | None = None,
    ) -> Path | None:
        """Gather every rank's ``records`` of ``step`` and write them (rank 0). Collective.

        ``pictures``: this rank's groups' images (``trajectory_pages.group_pictures``); when any
        rank has some, rank 0 also writes the step's HTML page."""
        gathered = records
        shown = pictures or []
        if dist.is_initialized() and dist.get_world_size() > 1:
            parts = all_gather_objects((records, shown))
            gathered = [record for part, _ in parts for record in part]
            shown = [group for _, groups in parts for group in groups]
        if self.rank != 0:
            return None
        if has_pictures(shown):
            self.directory.mkdir(parents=True, exist_ok=True)
            write_page(self.directory, step, gathered, shown)
        self.directory.mkdir(parents=True, exist_ok=True)
        final = trajectory_file(self.directory, step)
        temporary = self.directory / f".tmp-{final.name}"
        with temporary.open("w", encoding="utf-8") as file:
            for record in gathered:
                file.write(json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n")
        os.replace(temporary, final)
        return final
