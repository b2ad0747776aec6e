"""The TrainBackend suite catches broken backends.

``ReplicaBackend`` is a plain data-parallel backend (every rank holds the whole model and
averages gradients with an all-reduce, like DDP; its checkpoints load at any world size).
Correct, it passes the suite's tests used here; each defect below breaks one promise of the
contract and must make one test fail with a message that says what is wrong.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import ClassVar, Literal

import attrs
import pytest
import torch
import torch.distributed as dist

from lrft.api import (
    CapabilityNotSupported,
    FrozenModel,
    Location,
    ModelPart,
    OptimizerConfig,
    Placement,
    SchedulerConfig,
    StepReport,
    TrainableModel,
    TrainCapabilities,
)
from lrft.testing.conformance import train as train_checks
from lrft.testing.conformance.train import TrainBackendSuite
from lrft.testing.distributed import DistributedSuite, RankFailure, RankPool

Defect = (
    Literal[
        "no_all_reduce",
        "drops_a_tensor",
        "steps_on_nan",
        "drops_deferred",
        "never_decays",
        "linear_for_cosine",
        "ignores_floor",
        "applies_a_constant_rate",
        "sums_gradients",
        "reshards_without_optimizer",
    ]
    | None
)


def _applied(schedule: SchedulerConfig, defect: Defect) -> SchedulerConfig:
    """The schedule a defective replica follows instead of ``schedule``."""
    if defect in ("never_decays", "applies_a_constant_rate"):
        return attrs.evolve(schedule, kind="constant")
    if defect == "linear_for_cosine" and schedule.kind == "cosine":
        return attrs.evolve(schedule, kind="linear")
    if defect == "ignores_floor":
        return attrs.evolve(schedule, min_lr_ratio=0.0)
    return schedule


class ReplicaModel:
    def __init__(
        self,
        module: torch.nn.Module,
        defect: Defect,
        optimizer: OptimizerConfig | None = None,
        schedule: SchedulerConfig | None = None,
    ) -> None:
        self._module, self._defect = module, defect
        self._config = optimizer or OptimizerConfig()
        # "applies_a_constant_rate" reports the rate the schedule says, and applies another
        self._reported = schedule or SchedulerConfig()
        self._schedule = _applied(self._reported, defect)
        if defect != "applies_a_constant_rate":
            self._reported = self._schedule
        self.optimizer = torch.optim.AdamW(
            [p for p in module.parameters() if p.requires_grad] or [torch.zeros(1)],
            lr=self._config.lr * self._schedule.multiplier(0),
            betas=self._config.betas,
            eps=self._config.eps,
            weight_decay=self._config.weight_decay,
        )
        self._steps = 0

    @property
    def module(self) -> torch.nn.Module:
        return self._module

    @property
    def placement(self) -> Placement:
        here = Location.DEVICE
        return Placement(parameters=here, gradients=here, optimizer=here)

    @property
    def optimizer_steps(self) -> int:
        return self._steps

    def offload(self, parts: Collection[ModelPart]) -> None:
        for part in parts:
            raise CapabilityNotSupported("replica", f"offload_{part.value}")

    reload = offload

    def full_weights(
        self, bucket_bytes: int, *, gather_dtype: torch.dtype | None = None
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        del gather_dtype  # nothing is gathered: every rank holds the whole model
        named = list(self._module.named_parameters())
        if self._defect == "drops_a_tensor":
            named = named[:-1]
        bucket: list[tuple[str, torch.Tensor]] = []
        for name, param in named:
            size = sum(t.numel() * t.element_size() for _, t in bucket)
            if bucket and size + param.numel() * param.element_size() > bucket_bytes:
                yield bucket
                bucket = []
            bucket.append((name, param.detach()))
        if bucket:
            yield bucket

    def backward(self, loss: torch.Tensor, *, sync_gradients: bool = True) -> None:
        if self._defect == "drops_deferred" and not sync_gradients:
            return  # "deferring" by losing the micro-batch
        torch.autograd.backward(loss)

    def step(self) -> StepReport:
        params = [p for p in self._module.parameters() if p.grad is not None]
        summed = self._defect == "sums_gradients"  # and reports the norm of their mean
        if self._defect != "no_all_reduce":
            for param in params:
                assert param.grad is not None
                dist.all_reduce(param.grad, op=dist.ReduceOp.SUM if summed else dist.ReduceOp.AVG)
        bound = self._config.max_grad_norm if self._config.max_grad_norm > 0 else math.inf
        norm = float(torch.nn.utils.clip_grad_norm_(params, bound))
        if summed:
            norm /= dist.get_world_size()
        lr = self._config.lr * self._reported.multiplier(self._steps)
        if not math.isfinite(norm) and self._defect != "steps_on_nan":
            self.optimizer.zero_grad()
            return StepReport(optimizer_steps=self._steps, grad_norm=norm, skipped=True, lr=lr)
        self.optimizer.step()
        self.optimizer.zero_grad()
        self._steps += 1
        for group in self.optimizer.param_groups:
            group["lr"] = self._config.lr * self._schedule.multiplier(self._steps)
        return StepReport(optimizer_steps=self._steps, grad_norm=norm, skipped=False, lr=lr)

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        state = {"model": self._module.state_dict(), "optimizer": self.optimizer.state_dict()}
        if dist.get_rank() == 0:  # every rank holds the same state
            world = dist.get_world_size()
            torch.save({**state, "steps": self._steps, "world": world}, directory / "replica.pt")
        dist.barrier()

    def load(self, directory: Path) -> None:
        state = torch.load(directory / "replica.pt", weights_only=True)
        self._module.load_state_dict(state["model"])
        resharded = state["world"] != dist.get_world_size()
        if not (resharded and self._defect == "reshards_without_optimizer"):
            self.optimizer.load_state_dict(state["optimizer"])
        self._steps = state["steps"]


class ReplicaBackend:
    def __init__(self, defect: Defect) -> None:
        self._defect = defect

    name = "replica"
    capabilities = TrainCapabilities(checkpoint_resharding=True)
    device = torch.device("cpu")

    def prepare_trainable(
        self,
        model: torch.nn.Module,
        *,
        optimizer: OptimizerConfig,
        scheduler: SchedulerConfig | None = None,
    ) -> ReplicaModel:
        return ReplicaModel(model, self._defect, optimizer, scheduler)

    def prepare_frozen(self, model: torch.nn.Module) -> ReplicaModel:
        return ReplicaModel(model.requires_grad_(False).eval(), self._defect)


class _Replica(TrainBackendSuite[ReplicaBackend]):
    world_size = 2  # the pool these suites are run on (TestTrainSuiteTeeth's)
    defect: ClassVar[Defect] = None

    @classmethod
    def make_backend(cls) -> ReplicaBackend:
        return ReplicaBackend(cls.defect)

    @classmethod
    def parameter_shards(cls, model: FrozenModel) -> dict[str, torch.Tensor]:
        return dict(model.module.named_parameters())

    @classmethod
    def optimizer_state(cls, model: TrainableModel) -> dict[str, torch.Tensor]:
        assert isinstance(model, ReplicaModel)
        return {
            f"{index}:{key}": value
            for index, state in enumerate(model.optimizer.state.values())
            for key, value in state.items()
            if key != "step"
        }

    @classmethod
    def gathered_parameters(cls, model: FrozenModel) -> dict[str, torch.Tensor]:
        return {name: p.detach() for name, p in model.module.named_parameters()}


class _NoAllReduce(_Replica):
    defect = "no_all_reduce"


class _DropsATensor(_Replica):
    defect = "drops_a_tensor"


class _StepsOnNaN(_Replica):
    defect = "steps_on_nan"


class _DropsDeferred(_Replica):
    defect = "drops_deferred"


class _NeverDecays(_Replica):
    defect = "never_decays"


class _LinearForCosine(_Replica):
    defect = "linear_for_cosine"


class _IgnoresFloor(_Replica):
    defect = "ignores_floor"


class _AppliesAConstantRate(_Replica):
    defect = "applies_a_constant_rate"


class _SumsGradients(_Replica):
    defect = "sums_gradients"


class _ReshardsWithoutOptimizer(_Replica):
    defect = "reshards_without_optimizer"


class TestTrainSuiteTeeth(DistributedSuite):
    world_size = 2

    def test_correct_replica_passes(self, pool: RankPool) -> None:
        suite = _Replica()
        suite.run_check(pool, train_checks.check_training_matches_reference)
        suite.run_check(pool, train_checks.check_full_weights_are_complete_exact_and_bucketed)
        suite.run_check(pool, train_checks.check_non_finite_gradient_skips_step)
        suite.run_check(pool, train_checks.check_deferred_gradient_sync_matches_one_batch)
        suite.run_check(pool, train_checks.check_every_schedule_kind_past_warm_up)
        suite.run_check(pool, train_checks.check_training_without_clipping_matches_reference)
        train_checks.check_checkpoint_loads_at_another_world_size(_Replica, pool)

    @pytest.mark.parametrize(
        ("suite", "message"),
        [
            (
                _NeverDecays,
                r"step 2: StepReport\.lr is 0\.001, the schedule says 0\.000\d+ \(SchedulerConfig"
                r"\(kind='linear'",
            ),
            (
                _LinearForCosine,
                r"step 2: StepReport\.lr is 0\.00075, the schedule says 0\.0008125\d* "
                r"\(SchedulerConfig\(kind='cosine'",
            ),
            (
                _IgnoresFloor,
                r"step 2: StepReport\.lr is 0\.00066+\d*, the schedule says 0\.00075 "
                r"\(SchedulerConfig\(kind='linear'",
            ),
            (
                _AppliesAConstantRate,
                r"parameters after 6 steps of SchedulerConfig\(kind='linear'.*\) differ from the "
                r"single-process reference: max abs diff",
            ),
        ],
        ids=["never-decays", "linear-for-cosine", "ignores-floor", "applies-a-constant-rate"],
    )
    def test_schedule_test_catches_a_wrong_schedule(
        self, pool: RankPool, suite: type[_Replica], message: str
    ) -> None:
        with pytest.raises(RankFailure, match=message):
            suite().run_check(pool, train_checks.check_every_schedule_kind_past_warm_up)

    def test_unclipped_parity_catches_a_gradient_of_the_wrong_scale(self, pool: RankPool) -> None:
        # Clipped, the summed gradient is scaled to the same norm as the mean, so the parity
        # test passes, and the norm reported is the mean's: only clipping off shows the fault.
        _SumsGradients().run_check(pool, train_checks.check_training_matches_reference)
        with pytest.raises(
            RankFailure,
            match=r"parameters after 2 steps without gradient clipping \(max_grad_norm=0\) differ "
            r"from the single-process reference: max abs diff \d\.\d+e-0[1-4]",
        ):
            _SumsGradients().run_check(
                pool, train_checks.check_training_without_clipping_matches_reference
            )

    def test_resharding_test_catches_a_lost_optimizer_state(self, pool: RankPool) -> None:
        with pytest.raises(
            RankFailure,
            match=r"parameters after loading a world-2 checkpoint at world 1 and 2 more steps "
            r"differ from the single-process reference: max abs diff \d\.\d+e-0[1-4]",
        ):
            train_checks.check_checkpoint_loads_at_another_world_size(
                _ReshardsWithoutOptimizer, pool
            )

    def test_parity_catches_missing_gradient_all_reduce(self, pool: RankPool) -> None:
        with pytest.raises(
            RankFailure,
            match=r"parameters after 3 steps differ from the single-process reference: "
            r"max abs diff \d\.\d+e-0[1-4] in ",
        ):
            _NoAllReduce().run_check(pool, train_checks.check_training_matches_reference)

    def test_full_weights_catches_a_dropped_tensor(self, pool: RankPool) -> None:
        with pytest.raises(RankFailure, match=r"missing \['lm_head\.weight'\]"):
            _DropsATensor().run_check(
                pool, train_checks.check_full_weights_are_complete_exact_and_bucketed
            )

    def test_skip_test_catches_a_step_on_nan(self, pool: RankPool) -> None:
        with pytest.raises(RankFailure, match=r"a NaN gradient did not skip the step"):
            _StepsOnNaN().run_check(pool, train_checks.check_non_finite_gradient_skips_step)

    def test_deferred_sync_test_catches_a_lost_micro_batch(self, pool: RankPool) -> None:
        with pytest.raises(
            RankFailure,
            match=r"step 0: StepReport\.grad_norm is [\d.]+, the reference's global gradient norm",
        ):
            _DropsDeferred().run_check(
                pool, train_checks.check_deferred_gradient_sync_matches_one_batch
            )
