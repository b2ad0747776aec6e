"""The critic's update packed by tokens takes the optimizer steps the fixed micro-batches take:
each step's gradients equal the fixed path's, and only the step's last backward reduces."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor
from transformers import Qwen2ForTokenClassification

from lrft.testing.models import tiny_qwen2_config
from lrft.trainer.critic import CriticUpdate
from lrft.trainer.experience import ExperienceBatch
from lrft.trainer.replay import ReplayBuffer
from tests.unit.trainer.recorders import GradientRecorder
from tests.unit.trainer.samples import random_responses

CPU = torch.device("cpu")


def _critic() -> torch.nn.Module:
    config = tiny_qwen2_config()
    config.num_labels = 1
    config.classifier_dropout = 0.0  # as load_critic builds it: a train-mode forward is exact
    torch.manual_seed(0)
    return Qwen2ForTokenClassification(config)  # type: ignore[no-untyped-call]  # unannotated in transformers


def _experience(rows: int, seed: int) -> ExperienceBatch:
    """Responses of 1 to 9 tokens after prompts of 1 to 4; values and returns far enough apart
    that the value clip is active on some tokens."""
    generator = torch.Generator().manual_seed(seed)
    sequences = random_responses(rows, generator)
    mask = sequences.action_mask
    return ExperienceBatch(
        sequences=sequences,
        old_logprobs=None,
        ref_logprobs=None,
        scores=torch.zeros(rows),
        advantages=torch.zeros(mask.shape),
        values=torch.where(mask, torch.randn(mask.shape, generator=generator) * 0.1, 0.0),
        returns=torch.where(mask, torch.randn(mask.shape, generator=generator), 0.0),
    )


def _run(update: CriticUpdate, batch: ExperienceBatch) -> tuple[list[list[Tensor]], float]:
    recorder = GradientRecorder(_critic())
    buffer = ReplayBuffer(seed=5)
    buffer.append(batch)
    metrics = update.run(recorder, buffer, step=0, device=CPU)  # type: ignore[arg-type]  # a stand-in
    recorder.check_only_last_backward_syncs()
    return recorder.steps, metrics["critic/value_clip_fraction"]


@pytest.mark.parametrize("value_clip", [None, 0.05])
def test_token_budget_steps_equal_the_fixed_micro_batches(value_clip: float | None) -> None:
    batch = _experience(12, seed=1)
    settings = {"micro_batch_size": 3, "accumulation": 2, "epochs": 2, "value_clip": value_clip}
    fixed, fixed_clip = _run(CriticUpdate(**settings), batch)  # type: ignore[arg-type]
    packed, _ = _run(CriticUpdate(**settings, max_tokens_per_micro_batch=20), batch)  # type: ignore[arg-type]
    assert len(fixed) == len(packed) == 4  # 12 rows / (3 x 2) per step, two epochs
    if value_clip is not None:
        assert fixed_clip > 0  # the clip was in play
    for fixed_step, packed_step in zip(fixed, packed, strict=True):
        assert any(g.abs().sum() > 0 for g in fixed_step)
        for a, b in zip(packed_step, fixed_step, strict=True):
            scale = b.double().norm().clamp(min=1e-30)
            assert float((a.double() - b.double()).norm() / scale) < 1e-5


def test_a_buffer_that_leaves_micro_batches_without_a_step_is_refused() -> None:
    recorder = GradientRecorder(_critic())
    buffer = ReplayBuffer(seed=5)
    buffer.append(_experience(5, seed=2))  # 3 micro-batches of 2 (the last short), 2 per step
    update = CriticUpdate(micro_batch_size=2, accumulation=2, epochs=1, value_clip=None)
    with pytest.raises(RuntimeError, match=r"1 critic micro-batches were left without an"):
        update.run(recorder, buffer, step=0, device=CPU)  # type: ignore[arg-type]  # a stand-in
    assert recorder.steps == []  # refused before any forward
