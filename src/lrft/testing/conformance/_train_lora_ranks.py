"""Rank-side bodies of ``TrainBackendSuite``'s tests of a model that trains part of itself: a
LoRA model trains its adapters only (its base bit-identical after steps, the optimizer's state
the adapters' size, the base sharded as a frozen model of the same weights is), and an
``IncrementalWeightSource`` names the weights training changes and sees a write to the others."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from lrft.api.protocols import IncrementalWeightSource
from lrft.testing.conformance._registry import TRAIN_CHECKS
from lrft.testing.conformance._train_checks import assert_identical, check_buckets, host_copies
from lrft.testing.conformance._train_hooks import TrainBackendHooks
from lrft.testing.conformance._train_ranks import (
    BUCKET_BYTES,
    _collect,
    _train_step,
    trainable_model,
    whole_batch,
)
from lrft.testing.distributed import current_rank_context

Suite = type[TrainBackendHooks[Any]]

# AdamW keeps two moments per trained element; ZeRO pads each rank's flat partition a little.
_MOMENTS = 2
_PADDING_PER_RANK = 64


def _total(count: float) -> float:
    # on the rank's device: NCCL reduces no host tensors
    values = torch.tensor([count], dtype=torch.float64, device=current_rank_context().device)
    dist.all_reduce(values)
    return float(values.item())


@TRAIN_CHECKS
def check_lora_model_trains_its_adapters_only(suite: Suite) -> None:
    if not suite.lora:
        pytest.skip("the suite's model has no LoRA adapters")
    backend = suite.make_backend()
    model = trainable_model(suite, backend, 20)
    gathered = suite.gathered_parameters(model)
    trainable = sum(t.numel() for name, t in gathered.items() if ".lora_" in name)
    frozen_names = sorted(key for key in suite.parameter_shards(model) if ".lora_" not in key)
    before = host_copies({k: suite.parameter_shards(model)[k] for k in frozen_names})
    for step in range(2):
        _train_step(model, None, whole_batch(step, backend), step)
    after = host_copies({k: suite.parameter_shards(model)[k] for k in frozen_names})
    assert_identical(after, before, "the frozen base after two steps")
    held = _total(sum(t.numel() for t in suite.optimizer_state(model).values()))
    bound = _MOMENTS * trainable + _PADDING_PER_RANK * dist.get_world_size()
    if not _MOMENTS * trainable <= held <= bound:
        raise AssertionError(
            f"the optimizer holds {held:.0f} state elements over all ranks; AdamW over the "
            f"{trainable} adapter elements needs {_MOMENTS * trainable} (and a little padding)"
        )
    # The frozen base takes as much room on each rank as a frozen model of the same weights.
    frozen = backend.prepare_frozen(suite.model_for_load(20, 21))
    sharded = sum(t.numel() for k, t in suite.parameter_shards(model).items() if k in before)
    plain = sum(t.numel() for k, t in suite.parameter_shards(frozen).items() if ".lora_" not in k)
    if sharded != plain:
        raise AssertionError(
            f"this rank holds {sharded} elements of the trained model's frozen base, but "
            f"{plain} of a frozen model of the same weights: the base is not sharded like it"
        )


@TRAIN_CHECKS
def check_varying_weights_are_what_training_changes(suite: Suite) -> None:
    backend = suite.make_backend()
    model = trainable_model(suite, backend, 22)
    if not isinstance(model, IncrementalWeightSource):
        pytest.skip(f"{type(model).__name__} is not an IncrementalWeightSource")
    first = model.weights_mark(None)
    if first.varying_only:
        raise AssertionError("weights_mark(None) said the varying weights alone would do")
    before = dict(pair for bucket in _collect(model, 1 << 30) for pair in bucket)
    _train_step(model, None, whole_batch(0, backend), 0)
    update = model.weights_mark(first.mark)
    after = dict(pair for bucket in _collect(model, 1 << 30) for pair in bucket)
    varying = update.mark.varying
    steady = {name: after[name] for name in after if name not in varying}
    assert_identical(steady, {name: before[name] for name in steady}, "the non-varying weights")
    changed = sorted(name for name in after if not torch.equal(after[name], before[name]))
    assert set(changed) <= varying, f"weights outside the varying ones changed: {changed[:4]}"
    if update.varying_only != bool(steady):
        raise AssertionError(
            f"weights_mark(held) after a step says varying_only={update.varying_only}, with "
            f"{len(steady)} frozen weights unchanged"
        )
    buckets = _varying_buckets(model, BUCKET_BYTES)
    check_buckets(buckets, BUCKET_BYTES, "varying_weights")
    got = dict(pair for bucket in buckets for pair in bucket)
    assert set(got) == varying, f"varying_weights yields {sorted(got)[:4]}, not the varying ones"
    assert_identical(got, {name: after[name] for name in varying}, "varying_weights")
    if steady:
        _write_to_the_base(suite, model, update.mark)


def _varying_buckets(
    model: IncrementalWeightSource, bound: int
) -> list[list[tuple[str, torch.Tensor]]]:
    return [
        [(name, t.detach().to("cpu", copy=True)) for name, t in bucket]
        for bucket in model.varying_weights(bound)
    ]


def _write_to_the_base(suite: Suite, model: Any, held: Any) -> None:
    """A write to a frozen parameter on rank 0 alone: every rank must be told to send all."""
    shards = suite.parameter_shards(model)
    name = next(key for key in sorted(shards) if "embed_tokens" in key)
    if dist.get_rank() == 0:
        with torch.no_grad():
            shards[name].add_(1.0)
    update = model.weights_mark(held)
    if update.varying_only or update.mark.frozen_digest == held.frozen_digest:
        raise AssertionError(
            f"after a write to {name} on rank 0, weights_mark still says the frozen weights "
            f"are unchanged on rank {dist.get_rank()}: {update}"
        )
