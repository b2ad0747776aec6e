"""Rank-side bodies of ``TrainBackendSuite``'s tests of what the parity test cannot see: every
schedule kind past its warm-up (decay, shape and floor), gradient scale with clipping off (a
clipped gradient has the same norm whatever its scale), and a checkpoint loaded at another
world size (``checkpoint_resharding``)."""

from __future__ import annotations

import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from lrft.api.optim import OptimizerConfig, SchedulerConfig
from lrft.testing.conformance._registry import TRAIN_CHECKS
from lrft.testing.conformance._train_checks import (
    OPTIMIZER,
    SCHEDULE,
    Reference,
    assert_close,
    batch,
    check_report_matches,
    lm_loss,
    rank_share,
)
from lrft.testing.conformance._train_hooks import TrainBackendHooks
from lrft.testing.conformance._train_ranks import require, whole_batch
from lrft.testing.distributed import RankPool, missing_devices, shared_pool

Suite = type[TrainBackendHooks[Any]]

#: every kind, each with a warm-up, a decay that ends before the last step and a floor, so the
#: steps after warm-up tell them apart (and a schedule that ignores its floor from one that
#: keeps it)
SCHEDULES = (
    SchedulerConfig(kind="constant", warmup_steps=1),
    SchedulerConfig(kind="linear", warmup_steps=1, total_steps=4, min_lr_ratio=0.25),
    SchedulerConfig(kind="cosine", warmup_steps=1, total_steps=4, min_lr_ratio=0.25),
)
SCHEDULE_STEPS = 6
# Clipping off; a large eps makes AdamW's update nearly proportional to the gradient (it is
# scale-free where |grad| >> eps), so a gradient of the wrong scale moves the parameters wrongly.
UNCLIPPED = OptimizerConfig(
    lr=1e-2, betas=(0.9, 0.95), eps=1.0, weight_decay=0.1, max_grad_norm=0.0
)
#: the whole batch of the resharding test: its rank shares are equal at world 1, 2 and 4
RESHARDING_BATCH = 4


@TRAIN_CHECKS
def check_every_schedule_kind_past_warm_up(suite: Suite) -> float:
    """Per schedule: each step's reported learning rate as it comes, then the parameters (a
    backend may report the schedule's rate and apply another), then the reported norms."""
    backend = suite.make_backend()
    worst = 0.0
    for schedule in SCHEDULES:
        model = backend.prepare_trainable(
            suite.make_model(11), optimizer=OPTIMIZER, scheduler=schedule
        )
        reference = Reference(suite.make_model(11), backend.device, schedule=schedule)
        reports = []
        for step in range(SCHEDULE_STEPS):
            tokens = whole_batch(step, backend)
            model.backward(lm_loss(model.module, rank_share(tokens)))
            report, expected = model.step(), reference.step(tokens)
            if report.skipped:
                raise AssertionError(f"{schedule}: step {step} with a finite loss was skipped")
            check_report_matches(math.nan, report.lr, (math.nan, expected[1]), step, schedule)
            reports.append((report, expected))
        worst = max(
            worst,
            assert_close(
                suite.gathered_parameters(model),
                reference.parameters(),
                f"parameters after {SCHEDULE_STEPS} steps of {schedule}",
            ),
        )
        for step, (report, expected) in enumerate(reports):
            check_report_matches(report.grad_norm, report.lr, expected, step, schedule)
    return worst


@TRAIN_CHECKS
def check_training_without_clipping_matches_reference(suite: Suite, *, steps: int = 2) -> float:
    backend = suite.make_backend()
    model = backend.prepare_trainable(suite.make_model(12), optimizer=UNCLIPPED, scheduler=SCHEDULE)
    reference = Reference(suite.make_model(12), backend.device, optimizer=UNCLIPPED)
    reports = []
    for step in range(steps):
        tokens = whole_batch(step, backend)
        model.backward(lm_loss(model.module, rank_share(tokens)))
        reports.append((model.step(), reference.step(tokens)))
    # Parameters first: the report's norm can be right while the gradient applied is not.
    worst = assert_close(
        suite.gathered_parameters(model),
        reference.parameters(),
        f"parameters after {steps} steps without gradient clipping (max_grad_norm=0)",
    )
    for step, (report, expected) in enumerate(reports):
        if report.skipped:
            raise AssertionError(f"unclipped step {step} with a finite loss reported {report}")
        check_report_matches(report.grad_norm, report.lr, expected, step)
    return worst


def _resharding_tokens(step: int, device: torch.device) -> torch.Tensor:
    return batch(2000 + step, RESHARDING_BATCH, device)


def save_for_resharding(suite: Suite, directory: Path) -> None:
    """Two steps, then ``save(directory)``; skipped without ``checkpoint_resharding``."""
    backend = suite.make_backend()
    require(backend, "checkpoint_resharding")
    model = backend.prepare_trainable(suite.make_model(13), optimizer=OPTIMIZER, scheduler=SCHEDULE)
    for step in range(2):
        model.backward(lm_loss(model.module, rank_share(_resharding_tokens(step, backend.device))))
        report = model.step()
        if report.skipped:
            raise AssertionError(f"step {step} before saving was skipped: {report}")
    model.save(directory)


def resume_at_another_world_size(suite: Suite, directory: Path, saved_at: int) -> float:
    """Load what ``save_for_resharding`` wrote at world ``saved_at`` into a fresh model with
    other weights, then two more steps: they must equal a reference trained four steps."""
    backend = suite.make_backend()
    require(backend, "checkpoint_resharding")
    resumed = backend.prepare_trainable(
        suite.model_for_load(13, 14), optimizer=OPTIMIZER, scheduler=SCHEDULE
    )
    resumed.load(directory)
    if resumed.optimizer_steps != 2:
        raise AssertionError(
            f"a model loaded from a world-{saved_at} checkpoint of 2 steps reports "
            f"{resumed.optimizer_steps} steps"
        )
    reference = Reference(suite.make_model(13), backend.device)
    for step in range(2):
        reference.step(_resharding_tokens(step, backend.device))
    reports = []
    for step in (2, 3):
        tokens = _resharding_tokens(step, backend.device)
        resumed.backward(lm_loss(resumed.module, rank_share(tokens)))
        reports.append((step, resumed.step(), reference.step(tokens)))
    worst = assert_close(
        suite.gathered_parameters(resumed),
        reference.parameters(),
        f"parameters after loading a world-{saved_at} checkpoint at world {dist.get_world_size()} "
        "and 2 more steps",
    )
    for step, report, expected in reports:
        check_report_matches(report.grad_norm, report.lr, expected, step)
    return worst


@TRAIN_CHECKS.options(in_parent=True)
def check_checkpoint_loads_at_another_world_size(suite: Suite, pool: RankPool) -> None:
    """(``checkpoint_resharding``) Saved at the suite's world size, loaded at another
    (``resharding_world_size``: default 1, or 2 at world 1), two more steps equal the
    reference. Runs in the test process: it uses the pool and one of the other size."""
    other = suite.resharding_world_size or (2 if suite.world_size == 1 else 1)
    if (missing := missing_devices(other, suite.device_type)) is not None:
        pytest.skip(f"loading at world {other} {missing}")
    directory = Path(tempfile.mkdtemp(prefix="lrft-resharding-"))
    try:
        pool.run(save_for_resharding, suite, directory)
        diffs = shared_pool(other, suite.device_type).run(
            resume_at_another_world_size, suite, directory, suite.world_size
        )
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(f"saved at world {suite.world_size}, resumed at {other}: max abs {max(diffs):.2e}")
