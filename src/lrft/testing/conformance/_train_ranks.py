"""The rank-side bodies of ``TrainBackendSuite``'s tests: each runs on every rank of the pool.

Each takes the suite class (for ``make_backend``, the backdoors and the model) and plain
arguments, so it is picklable and can run on any harness that has initialised the default
process group.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import pytest
import torch
import torch.distributed as dist

from lrft.api.capabilities import TrainCapabilities
from lrft.api.errors import CapabilityNotSupported
from lrft.api.protocols import FrozenModel, TrainableModel, TrainBackend, WeightSource
from lrft.api.types import Location, ModelPart, Placement
from lrft.dist.collectives import broadcast_object
from lrft.testing.conformance._registry import TRAIN_CHECKS
from lrft.testing.conformance._train_checks import (
    OPTIMIZER,
    SCHEDULE,
    Reference,
    assert_close,
    assert_identical,
    batch,
    check_buckets,
    check_names,
    check_report_matches,
    host_copies,
    lm_loss,
    rank_share,
)
from lrft.testing.conformance._train_hooks import TrainBackendHooks
from lrft.testing.distributed import current_rank_context

Suite = type[TrainBackendHooks[Any]]

BATCH_PER_RANK = 2
# Forces several buckets with the tiny model: its 64 KiB embedding travels alone, its 32 KiB
# MLP matrices pair up with nothing larger than 8 KiB.
BUCKET_BYTES = 40_000


def require(backend: TrainBackend, capability: str) -> None:
    if capability not in backend.capabilities.names():
        pytest.skip(
            f"requires capability {capability!r}, which backend {backend.name!r} does not declare"
        )


def trainable_model(
    suite: Suite, backend: TrainBackend, seed: int, *, tied: bool = False
) -> TrainableModel:
    model = suite.make_model(seed, tie_word_embeddings=tied)
    return backend.prepare_trainable(model, optimizer=OPTIMIZER, scheduler=SCHEDULE)


def reference_for(
    suite: Suite, backend: TrainBackend, seed: int, *, tied: bool = False
) -> Reference:
    return Reference(suite.make_model(seed, tie_word_embeddings=tied), backend.device)


def whole_batch(step: int, backend: TrainBackend, per_rank: int = BATCH_PER_RANK) -> torch.Tensor:
    return batch(1000 + step, per_rank * dist.get_world_size(), backend.device)


def _train_step(
    model: TrainableModel, reference: Reference | None, tokens: torch.Tensor, step: int
) -> None:
    """One step of ``model`` on this rank's share and of ``reference`` on the whole batch."""
    model.backward(lm_loss(model.module, rank_share(tokens)))
    report = model.step()
    if report.skipped:
        raise AssertionError(f"step {step} was skipped with a finite loss: {report}")
    if reference is not None:
        check_report_matches(report.grad_norm, report.lr, reference.step(tokens), step)
    if report.optimizer_steps != model.optimizer_steps:
        raise AssertionError(
            f"StepReport says {report.optimizer_steps} steps, the model {model.optimizer_steps}"
        )


def _check_placement(model: FrozenModel, part: ModelPart, where: Location) -> None:
    placement = model.placement
    if placement.of(part) is not where:
        raise AssertionError(
            f"after moving {part.value}, placement reports {placement}, expected {where.value}"
        )


def _check_devices(tensors: dict[str, torch.Tensor], device: torch.device, what: str) -> None:
    elsewhere = sorted(name for name, t in tensors.items() if t.device.type != device.type)
    if elsewhere:
        raise AssertionError(
            f"{what} not on {device.type}: {elsewhere[:3]} ({len(elsewhere)} in all)"
        )


@TRAIN_CHECKS
def check_satisfies_protocols(suite: Suite) -> None:
    backend = suite.make_backend()
    assert isinstance(backend, TrainBackend), f"{type(backend).__name__} is not a TrainBackend"
    assert isinstance(backend.capabilities, TrainCapabilities), (
        "capabilities is not TrainCapabilities"
    )
    expected = current_rank_context().device
    assert backend.device.type == expected.type, (
        f"backend device {backend.device}, rank's {expected}"
    )
    trainable = trainable_model(suite, backend, 0)
    assert isinstance(trainable, TrainableModel), (
        f"{type(trainable).__name__} is not a TrainableModel"
    )
    assert isinstance(trainable, WeightSource), f"{type(trainable).__name__} is not a WeightSource"
    assert trainable.optimizer_steps == 0, (
        f"a fresh model reports {trainable.optimizer_steps} steps"
    )
    assert isinstance(trainable.placement, Placement), "placement is not a Placement"
    frozen = backend.prepare_frozen(suite.make_model(0))
    assert isinstance(frozen, FrozenModel), f"{type(frozen).__name__} is not a FrozenModel"
    assert not any(p.requires_grad for p in frozen.module.parameters()), (
        "frozen parameters need grads"
    )


@TRAIN_CHECKS
def check_training_matches_reference(suite: Suite, *, steps: int = 3) -> float:
    backend = suite.make_backend()
    model, reference = trainable_model(suite, backend, 0), reference_for(suite, backend, 0)
    reports = []
    for step in range(steps):
        tokens = whole_batch(step, backend)
        model.backward(lm_loss(model.module, rank_share(tokens)))
        reports.append((model.step(), reference.step(tokens)))
    # Parameters first: diverging weights are the symptom that matters most.
    worst = assert_close(
        suite.gathered_parameters(model), reference.parameters(), f"parameters after {steps} steps"
    )
    for step, (report, expected) in enumerate(reports):
        if report.skipped or report.optimizer_steps != step + 1:
            raise AssertionError(f"step {step} with a finite loss reported {report}")
        check_report_matches(report.grad_norm, report.lr, expected, step)
    return worst


@TRAIN_CHECKS
def check_accumulated_micro_batches_match_one_batch(suite: Suite) -> float:
    """2 micro-batches per step equal one batch."""
    return accumulation_matches_one_batch(suite, micro_batches=2)


@TRAIN_CHECKS
def check_deferred_gradient_sync_matches_one_batch(suite: Suite) -> float:
    """3 micro-batches per step, the gradient sync deferred to the last, equal one batch."""
    return accumulation_matches_one_batch(suite, micro_batches=3, defer_sync=True)


def accumulation_matches_one_batch(
    suite: Suite, *, micro_batches: int, defer_sync: bool = False
) -> float:
    """``defer_sync``: every micro-batch but the last passes ``sync_gradients=False``."""
    backend = suite.make_backend()
    model = trainable_model(suite, backend, 1, tied=True)
    reference = reference_for(suite, backend, 1, tied=True)
    for step in range(2):
        tokens = whole_batch(step, backend, per_rank=BATCH_PER_RANK * micro_batches)
        micros = rank_share(tokens).chunk(micro_batches)
        for index, micro in enumerate(micros):
            last = index == len(micros) - 1
            model.backward(
                lm_loss(model.module, micro) / micro_batches,
                sync_gradients=last or not defer_sync,
            )
        report = model.step()
        check_report_matches(report.grad_norm, report.lr, reference.step(tokens), step)
    what = f"parameters after {micro_batches} accumulated micro-batches per step"
    return assert_close(suite.gathered_parameters(model), reference.parameters(), what)


@TRAIN_CHECKS
def check_non_finite_gradient_skips_step(suite: Suite) -> float:
    backend = suite.make_backend()
    model, reference = trainable_model(suite, backend, 2), reference_for(suite, backend, 2)
    _train_step(model, reference, whole_batch(0, backend), 0)
    before = host_copies(suite.parameter_shards(model)), host_copies(suite.optimizer_state(model))
    # Only rank 0's loss is poisoned: the decision to skip must still be the same on every rank.
    poison = float("nan") if dist.get_rank() == 0 else 1.0
    model.backward(lm_loss(model.module, rank_share(whole_batch(99, backend))) * poison)
    report = model.step()
    if not report.skipped or math.isfinite(report.grad_norm):
        raise AssertionError(f"a NaN gradient did not skip the step: {report}")
    if report.optimizer_steps != 1 or model.optimizer_steps != 1:
        raise AssertionError(f"a skipped step was counted: {report}, {model.optimizer_steps} steps")
    assert_identical(
        host_copies(suite.parameter_shards(model)), before[0], "parameters after a skipped step"
    )
    assert_identical(
        host_copies(suite.optimizer_state(model)), before[1], "optimizer state after a skipped step"
    )
    for step in (1, 2):  # the reference never saw the poisoned batch
        _train_step(model, reference, whole_batch(step, backend), step)
    return assert_close(
        suite.gathered_parameters(model), reference.parameters(), "parameters after a skipped step"
    )


def _collect(
    source: WeightSource, bound: int, gather_dtype: torch.dtype | None = None
) -> list[list[tuple[str, torch.Tensor]]]:
    # A yielded tensor is only valid until the next bucket is requested: keep copies.
    return [
        [(name, t.detach().to("cpu", copy=True)) for name, t in b]
        for b in source.full_weights(bound, gather_dtype=gather_dtype)
    ]


def _check_full_weights(
    source: WeightSource,
    expected: dict[str, torch.Tensor],
    what: str,
    gather_dtype: torch.dtype | None = None,
) -> int:
    """With ``gather_dtype``, a tensor may come in that dtype (then equal to the expected one
    cast to it) or in its own."""
    buckets = _collect(source, BUCKET_BYTES, gather_dtype)
    check_buckets(buckets, BUCKET_BYTES, what)
    names = [name for bucket in buckets for name, _ in bucket]
    check_names(names, list(expected), what)
    got = dict(pair for bucket in buckets for pair in bucket)
    wanted = dict(expected)
    for name, tensor in got.items():
        if tensor.dtype == gather_dtype and wanted[name].dtype != gather_dtype:
            wanted[name] = wanted[name].to(gather_dtype)
    assert_identical(got, wanted, what)
    return len(buckets)


@TRAIN_CHECKS
def check_full_weights_are_complete_exact_and_bucketed(suite: Suite) -> None:
    backend = suite.make_backend()
    for tied in (False, True):
        initial = dict(suite.make_model(3, tie_word_embeddings=tied).named_parameters())
        plain = host_copies(suite.full_weights_of(initial))
        model = trainable_model(suite, backend, 3, tied=tied)
        what = f"full_weights ({'tied' if tied else 'untied'} embeddings)"
        buckets = _check_full_weights(model, plain, what)
        assert buckets >= 4, f"{what}: {buckets} buckets; the bound should force several"
        _train_step(model, None, whole_batch(0, backend), 0)
        trained = host_copies(suite.full_weights_of(suite.gathered_parameters(model)))
        _check_full_weights(model, trained, f"{what} after a step")
        _check_full_weights(
            model, trained, f"{what} with gather_dtype=float16", gather_dtype=torch.float16
        )


@TRAIN_CHECKS
def check_offload_reload_parameters(suite: Suite) -> None:
    backend = suite.make_backend()
    require(backend, "offload_parameters")
    model, reference = trainable_model(suite, backend, 4), reference_for(suite, backend, 4)
    _train_step(model, reference, whole_batch(0, backend), 0)
    before = host_copies(suite.parameter_shards(model))
    for _ in range(2):  # offloading what is already on the host does nothing
        model.offload([ModelPart.PARAMETERS])
        _check_placement(model, ModelPart.PARAMETERS, Location.HOST)
        _check_devices(suite.parameter_shards(model), torch.device("cpu"), "offloaded parameters")
    model.reload([ModelPart.PARAMETERS])
    _check_placement(model, ModelPart.PARAMETERS, Location.DEVICE)
    _check_devices(suite.parameter_shards(model), backend.device, "reloaded parameters")
    assert_identical(host_copies(suite.parameter_shards(model)), before, "reloaded parameters")
    _train_step(model, reference, whole_batch(1, backend), 1)
    assert_close(
        suite.gathered_parameters(model), reference.parameters(), "parameters after offload/reload"
    )


@TRAIN_CHECKS
def check_offload_reload_optimizer(suite: Suite) -> None:
    backend = suite.make_backend()
    require(backend, "offload_optimizer")
    model, reference = trainable_model(suite, backend, 5), reference_for(suite, backend, 5)
    _train_step(model, reference, whole_batch(0, backend), 0)
    before = host_copies(suite.optimizer_state(model))
    model.offload([ModelPart.OPTIMIZER])
    _check_placement(model, ModelPart.OPTIMIZER, Location.HOST)
    _check_devices(suite.optimizer_state(model), torch.device("cpu"), "offloaded optimizer state")
    model.reload([ModelPart.OPTIMIZER])
    _check_placement(model, ModelPart.OPTIMIZER, Location.DEVICE)
    _check_devices(suite.optimizer_state(model), backend.device, "reloaded optimizer state")
    assert_identical(host_copies(suite.optimizer_state(model)), before, "reloaded optimizer state")
    _train_step(model, reference, whole_batch(1, backend), 1)
    assert_close(
        suite.gathered_parameters(model), reference.parameters(), "parameters after offload/reload"
    )


def _twin_runs(suite: Suite, backend: TrainBackend, parts: list[ModelPart]) -> None:
    """Two identical models; one moves ``parts`` out and back between backward and step."""
    moved, still = trainable_model(suite, backend, 6), trainable_model(suite, backend, 6)
    for model in (moved, still):
        _train_step(model, None, whole_batch(0, backend), 0)
        model.backward(lm_loss(model.module, rank_share(whole_batch(1, backend))))
    moved.offload(parts)
    for part in parts:
        _check_placement(moved, part, Location.HOST)
    moved.reload(parts)
    for part in parts:
        _check_placement(moved, part, Location.DEVICE)
    for model in (moved, still):
        model.step()
    what = f"parameters after offloading and reloading {[p.value for p in parts]} before step()"
    assert_identical(suite.gathered_parameters(moved), suite.gathered_parameters(still), what)


@TRAIN_CHECKS
def check_offload_reload_gradients(suite: Suite) -> None:
    backend = suite.make_backend()
    require(backend, "offload_gradients")
    _twin_runs(suite, backend, [ModelPart.GRADIENTS])


@TRAIN_CHECKS
def check_offload_everything_mid_accumulation(suite: Suite) -> None:
    backend = suite.make_backend()
    for part in ModelPart:
        require(backend, f"offload_{part.value}")
    _twin_runs(suite, backend, list(ModelPart))


@TRAIN_CHECKS
def check_undeclared_offload_raises(suite: Suite) -> None:
    backend = suite.make_backend()
    trainable = trainable_model(suite, backend, 0)
    frozen = backend.prepare_frozen(suite.make_model(0))
    declared = backend.capabilities.offload
    # A frozen model holds no gradients or optimizer state: those parts are never offloadable.
    cases: list[tuple[FrozenModel, ModelPart]] = [
        (trainable, p) for p in ModelPart if p not in declared
    ]
    cases += [(frozen, p) for p in ModelPart if p is not ModelPart.PARAMETERS or p not in declared]
    for model, part in cases:
        placement = model.placement
        for call in (model.offload, model.reload):
            try:
                call([part])
            except CapabilityNotSupported as error:
                if error.capability != f"offload_{part.value}":
                    raise AssertionError(f"{error!r} does not name offload_{part.value}") from error
            else:
                raise AssertionError(
                    f"{type(model).__name__}.{call.__name__}([{part}]) did not raise"
                )
            assert model.placement == placement, f"a refused {call.__name__} changed the placement"


@TRAIN_CHECKS
def check_save_load_resumes_bit_exactly(suite: Suite) -> None:
    backend = suite.make_backend()
    token = broadcast_object(uuid.uuid4().hex if dist.get_rank() == 0 else None, src=0)
    directory = current_rank_context().shared_dir / f"{suite.__name__}-{token}"
    saved, uninterrupted = trainable_model(suite, backend, 7), trainable_model(suite, backend, 7)
    for step in range(2):  # inside the warm-up: the schedule's position matters after loading
        for model in (saved, uninterrupted):
            _train_step(model, None, whole_batch(step, backend), step)
    saved.save(directory)
    # A fresh backend and model with different initial weights: only load() can make it equal.
    resumed = suite.make_backend().prepare_trainable(
        suite.model_for_load(7, 8), optimizer=OPTIMIZER, scheduler=SCHEDULE
    )
    resumed.load(directory)
    if resumed.optimizer_steps != 2:
        raise AssertionError(f"a loaded model reports {resumed.optimizer_steps} steps, not 2")
    lrs = []
    for step in (2, 3):
        for model in (saved, uninterrupted, resumed):
            model.backward(lm_loss(model.module, rank_share(whole_batch(step, backend))))
            lrs.append(model.step().lr)
    if len(set(lrs[:3])) != 1 or len(set(lrs[3:])) != 1:
        raise AssertionError(f"learning rates (saved, uninterrupted, resumed) per step: {lrs}")
    expected = host_copies(suite.gathered_parameters(uninterrupted))
    assert_identical(
        host_copies(suite.gathered_parameters(resumed)), expected, "resumed parameters"
    )
    assert_identical(
        host_copies(suite.gathered_parameters(saved)), expected, "parameters after save"
    )


@TRAIN_CHECKS
def check_frozen_model_matches_plain_model(suite: Suite) -> float:
    backend = suite.make_backend()
    plain = suite.make_model(9, tie_word_embeddings=True).to(backend.device)
    frozen = backend.prepare_frozen(suite.make_model(9, tie_word_embeddings=True))
    tokens = rank_share(whole_batch(0, backend))
    with torch.no_grad():
        got = {"logits": frozen.module(input_ids=tokens).logits}
        want = {"logits": plain(input_ids=tokens).logits}
    worst = assert_close(got, want, "frozen model logits")
    expected = host_copies(suite.full_weights_of(dict(plain.named_parameters())))
    _check_full_weights(frozen, expected, "frozen full_weights")
    return worst


@TRAIN_CHECKS
def check_frozen_offload_reload(suite: Suite) -> None:
    backend = suite.make_backend()
    require(backend, "offload_parameters")
    plain = suite.make_model(10).to(backend.device)
    frozen = backend.prepare_frozen(suite.make_model(10))
    tokens = rank_share(whole_batch(0, backend))
    before = host_copies(suite.parameter_shards(frozen))
    frozen.offload([ModelPart.PARAMETERS])
    _check_placement(frozen, ModelPart.PARAMETERS, Location.HOST)
    _check_devices(suite.parameter_shards(frozen), torch.device("cpu"), "offloaded parameters")
    frozen.reload([ModelPart.PARAMETERS])
    _check_placement(frozen, ModelPart.PARAMETERS, Location.DEVICE)
    assert_identical(host_copies(suite.parameter_shards(frozen)), before, "reloaded parameters")
    with torch.no_grad():
        got = {"logits": frozen.module(input_ids=tokens).logits}
        want = {"logits": plain(input_ids=tokens).logits}
    assert_close(got, want, "frozen model logits after offload/reload")
