"""The ``deepspeed`` backend against the TrainBackend and WeightSync suites: ZeRO stages 1, 2 and 3
at world sizes 1 and 2 on gloo/CPU, and a parity check of ZeRO-3 against FSDP2.

Skipped as a whole where deepspeed is not installed (``pip install 'lrft[deepspeed]'``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import pytest
import torch

pytest.importorskip("deepspeed", reason="deepspeed is not installed: pip install 'lrft[deepspeed]'")

from lrft.api import FrozenModel, RolloutEngine, TrainableModel
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.backends.sync import DirectSync
from lrft.backends.train.deepspeed import (
    DeepSpeedBackend,
    DeepSpeedConfig,
    DeepSpeedFrozenModel,
    DeepSpeedTrainableModel,
    ZeroStage,
    hf_named_parameters,
)
from lrft.testing.conformance.sync import WeightSyncSuite
from lrft.testing.conformance.train import TrainBackendSuite
from lrft.testing.distributed import DistributedSuite, RankPool, current_rank_context
from lrft.testing.lora import LoraTrainModels


def _backend(stage: ZeroStage) -> DeepSpeedBackend:
    # fp32, and every parameter of the tiny model really sharded under ZeRO-3 (the default
    # threshold of 1e5 elements would keep all of them whole on every rank).
    config = DeepSpeedConfig(zero_stage=stage, mixed_precision=False, param_persistence_threshold=0)
    return DeepSpeedBackend(config)


@torch.no_grad()
def _gathered(model: FrozenModel) -> dict[str, torch.Tensor]:
    named = hf_named_parameters(_inner(model))
    partitioned = [p for _, p in named if hasattr(p, "ds_id")]
    if not partitioned:
        return {name: p.detach() for name, p in named}
    from deepspeed.runtime.zero import GatheredParameters

    with GatheredParameters(partitioned, modifier_rank=None):
        return {name: p.detach().clone() for name, p in named}


def _inner(model: FrozenModel) -> torch.nn.Module:
    """The user's model inside the handle (the engine's ``module``, or the plain replica)."""
    assert isinstance(model, DeepSpeedFrozenModel)
    return model.engine.module if model.engine is not None else model.module


class DeepSpeedSuite(TrainBackendSuite[DeepSpeedBackend]):
    zero_stage: ClassVar[ZeroStage] = 3

    @classmethod
    def make_backend(cls) -> DeepSpeedBackend:
        return _backend(cls.zero_stage)

    @classmethod
    def parameter_shards(cls, model: FrozenModel) -> dict[str, torch.Tensor]:
        shards = {}
        for name, param in hf_named_parameters(_inner(model)):
            shard = getattr(param, "ds_tensor", None)
            shards[name] = shard if isinstance(shard, torch.Tensor) else param
        return shards

    @classmethod
    def optimizer_state(cls, model: TrainableModel) -> dict[str, torch.Tensor]:
        assert isinstance(model, DeepSpeedTrainableModel)
        # AdamW steps this rank's flat fp32 partitions: one tensor per group, one state each.
        return {
            f"partition{index}:{key}": value
            for index, state in enumerate(model.optimizer.state.values())
            for key, value in state.items()
            if key != "step"
        }

    @classmethod
    def gathered_parameters(cls, model: FrozenModel) -> dict[str, torch.Tensor]:
        assert isinstance(model, DeepSpeedFrozenModel)
        return _gathered(model)


class TestZero1World1(DeepSpeedSuite):
    zero_stage = 1
    world_size = 1


class TestZero1World2(DeepSpeedSuite):
    zero_stage = 1
    world_size = 2


class TestZero2World1(DeepSpeedSuite):
    zero_stage = 2
    world_size = 1


class TestZero2World2(DeepSpeedSuite):
    zero_stage = 2
    world_size = 2


class TestZero3World1(DeepSpeedSuite):
    zero_stage = 3
    world_size = 1


class TestZero3World2(DeepSpeedSuite):
    zero_stage = 3
    world_size = 2


class TestZero3World4(DeepSpeedSuite):
    zero_stage = 3
    world_size = 4


class TestZero3PersistentSmallParametersWorld2(DeepSpeedSuite):
    """DeepSpeed's default persistence threshold (1e5 elements) keeps every parameter of the tiny
    model whole on every rank: offload, gathering and checkpoints must handle persistent ones."""

    zero_stage = 3
    world_size = 2

    @classmethod
    def make_backend(cls) -> DeepSpeedBackend:
        return DeepSpeedBackend(DeepSpeedConfig(zero_stage=3, mixed_precision=False))


class TestZero3LoraWorld1(LoraTrainModels, DeepSpeedSuite):
    zero_stage = 3
    world_size = 1


class TestZero3LoraWorld2(LoraTrainModels, DeepSpeedSuite):
    zero_stage = 3
    world_size = 2


class TestZero2LoraWorld2(LoraTrainModels, DeepSpeedSuite):
    zero_stage = 2
    world_size = 2


class DeepSpeedSyncSuite(WeightSyncSuite[DirectSync]):
    zero_stage: ClassVar[ZeroStage] = 3

    @classmethod
    def make_sync(cls, bucket_bytes: int) -> DirectSync:
        return DirectSync(bucket_bytes=bucket_bytes)

    @classmethod
    def make_train_backend(cls) -> DeepSpeedBackend:
        return _backend(cls.zero_stage)

    @classmethod
    def make_engine(
        cls, model_dir: Path, dtype: torch.dtype, device: torch.device
    ) -> HFRolloutEngine:
        config = HFEngineConfig(device=device, dtype=dtype)
        return HFRolloutEngine.from_pretrained(model_dir, config=config)

    @classmethod
    def read_engine_weights(cls, engine: RolloutEngine) -> Mapping[str, torch.Tensor]:
        assert isinstance(engine, HFRolloutEngine)
        return dict(engine.model.named_parameters())


class TestSyncZero1World1(DeepSpeedSyncSuite):
    zero_stage = 1
    world_size = 1


class TestSyncZero1World2(DeepSpeedSyncSuite):
    zero_stage = 1
    world_size = 2


class TestSyncZero2World1(DeepSpeedSyncSuite):
    zero_stage = 2
    world_size = 1


class TestSyncZero2World2(DeepSpeedSyncSuite):
    zero_stage = 2
    world_size = 2


class TestSyncZero3World1(DeepSpeedSyncSuite):
    zero_stage = 3
    world_size = 1


class TestSyncZero3World2(DeepSpeedSyncSuite):
    zero_stage = 3
    world_size = 2


class TestSyncZero3World4(DeepSpeedSyncSuite):
    zero_stage = 3
    world_size = 4


# --- ZeRO-3 against FSDP2 ----------------------------------------------------------------------

PARITY_STEPS = 5
PARITY_MICRO_BATCHES = 2


@torch.no_grad()
def _fsdp2_gathered(model: TrainableModel) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    return {
        name: (p.full_tensor() if isinstance(p, DTensor) else p.detach()).clone()
        for name, p in model.module.named_parameters()
    }


def _zero3_against_fsdp2(steps: int, micro_batches: int) -> tuple[float, float]:
    """Train the same model on the same batches with FSDP2 and ZeRO-3; the largest parameter
    difference after ``steps`` steps, and the largest relative gradient-norm difference."""
    from lrft.backends.train.fsdp2 import FSDP2Backend, FSDP2Config
    from lrft.testing.conformance._train_checks import (
        OPTIMIZER,
        SCHEDULE,
        assert_close,
        batch,
        lm_loss,
        rank_share,
    )
    from lrft.testing.models import tiny_causal_lm

    device = current_rank_context().device
    fsdp2 = FSDP2Backend(FSDP2Config(mixed_precision=False)).prepare_trainable(
        tiny_causal_lm(11), optimizer=OPTIMIZER, scheduler=SCHEDULE
    )
    zero3 = _backend(3).prepare_trainable(
        tiny_causal_lm(11), optimizer=OPTIMIZER, scheduler=SCHEDULE
    )
    worst_norm = 0.0
    for step in range(steps):
        tokens = batch(3000 + step, 2 * micro_batches * current_rank_context().world_size, device)
        reports = []
        for model in (fsdp2, zero3):
            for micro in rank_share(tokens).chunk(micro_batches):
                model.backward(lm_loss(model.module, micro) / micro_batches)
            reports.append(model.step())
        expected, got = reports
        assert not got.skipped, got
        assert got.optimizer_steps == step + 1, got
        assert got.lr == expected.lr, (got, expected)
        worst_norm = max(worst_norm, abs(got.grad_norm - expected.grad_norm) / expected.grad_norm)
    worst = assert_close(
        _gathered(zero3), _fsdp2_gathered(fsdp2), f"ZeRO-3 against FSDP2 after {steps} steps"
    )
    return worst, worst_norm


class TestZero3MatchesFSDP2World2(DistributedSuite):
    world_size = 2

    def test_five_steps_give_equal_parameters(self, pool: RankPool) -> None:
        results = pool.run(_zero3_against_fsdp2, PARITY_STEPS, PARITY_MICRO_BATCHES)
        worst = max(diff for diff, _ in results)
        worst_norm = max(norm for _, norm in results)
        assert worst_norm < 1e-4, f"gradient norms differ by {worst_norm:.2e} (relative)"
        print(
            f"ZeRO-3 vs FSDP2 after {PARITY_STEPS} steps at world 2: max abs parameter diff "
            f"{worst:.2e}, max relative grad-norm diff {worst_norm:.2e}"
        )
