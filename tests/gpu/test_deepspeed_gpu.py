"""The ``deepspeed`` backend on NCCL/CUDA at worlds 1, 2 and 4: the CPU suites on GPUs, and device memory
really released by ``offload`` under ZeRO-3 (bf16 parameters, fp32 master weights and AdamW).

Skipped with a reason where deepspeed is not installed or too few CUDA devices are visible.
Memory is measured with ``torch.cuda.memory_allocated`` on a ~150 M-parameter model, against the
bytes of the tensors that should leave the device (read from the ZeRO-3 shards and the optimizer).
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("deepspeed", reason="deepspeed is not installed: pip install 'lrft[deepspeed]'")

from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
from transformers import Qwen2Config, Qwen2ForCausalLM

from lrft.api import ModelPart, OptimizerConfig
from lrft.backends.train.deepspeed import DeepSpeedBackend, DeepSpeedConfig
from lrft.testing.distributed import DistributedSuite, RankPool, current_rank_context
from lrft.testing.lora import LoraTrainModels
from tests.conformance.test_deepspeed import DeepSpeedSuite, DeepSpeedSyncSuite

MIB = 1024 * 1024


# World 1 runs where the machine has one GPU: ZeRO's partitioning is trivial there, but its
# CUDA paths (bf16 parameters, the NCCL group, offload to the host) are the same.
class TestZero3CudaWorld1(DeepSpeedSuite):
    zero_stage = 3
    world_size = 1
    device_type = "cuda"


class TestSyncZero3CudaWorld1(DeepSpeedSyncSuite):
    zero_stage = 3
    world_size = 1
    device_type = "cuda"


class TestZero1CudaWorld2(DeepSpeedSuite):
    zero_stage = 1
    world_size = 2
    device_type = "cuda"


class TestZero3LoraCudaWorld2(LoraTrainModels, DeepSpeedSuite):
    zero_stage = 3
    world_size = 2
    device_type = "cuda"


class TestZero2CudaWorld2(DeepSpeedSuite):
    zero_stage = 2
    world_size = 2
    device_type = "cuda"


class TestZero3CudaWorld2(DeepSpeedSuite):
    zero_stage = 3
    world_size = 2
    device_type = "cuda"


class TestSyncZero3CudaWorld2(DeepSpeedSyncSuite):
    zero_stage = 3
    world_size = 2
    device_type = "cuda"


class TestZero3CudaWorld4(DeepSpeedSuite):
    zero_stage = 3
    world_size = 4
    device_type = "cuda"


class TestSyncZero3CudaWorld4(DeepSpeedSyncSuite):
    zero_stage = 3
    world_size = 4
    device_type = "cuda"


def _model() -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config)


def _bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _shards(module: torch.nn.Module) -> list[torch.Tensor]:
    shards = [getattr(p, "ds_tensor", None) for p in module.parameters()]
    assert all(isinstance(s, torch.Tensor) for s in shards), "parameters are not ZeRO-3 shards"
    return [s for s in shards if isinstance(s, torch.Tensor)]


def _allocated(device: torch.device) -> int:
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device)


def _zero3_offload_figures() -> dict[str, float]:
    device = current_rank_context().device
    torch.cuda.empty_cache()
    base = _allocated(device)
    # Default precision: bf16 parameters on CUDA, fp32 master weights and AdamW state.
    backend = DeepSpeedBackend(DeepSpeedConfig(zero_stage=3, param_persistence_threshold=0))
    policy = backend.prepare_trainable(_model(), optimizer=OptimizerConfig(lr=1e-5))
    ids = torch.randint(0, 32000, (2, 128), device=device)
    policy.backward(policy.module(input_ids=ids, labels=ids).loss)
    assert not policy.step().skipped
    trained = _allocated(device) - base
    inner = policy.engine.module
    state = [
        value
        for per_tensor in policy.optimizer.state.values()
        for key, value in per_tensor.items()
        if key != "step" and isinstance(value, torch.Tensor)
    ]
    # ZeRO-3 empties AdamW's param_groups between steps: the fp32 master partitions live in the
    # ZeRO optimizer only.
    zero = policy.engine.optimizer
    assert isinstance(zero, DeepSpeedZeroOptimizer_Stage3), type(zero).__name__
    masters = list(zero.fp32_partitioned_groups_flat)
    assert state, "no AdamW moments to offload"
    assert masters, "no fp32 master partitions to offload"
    # Held across offload and reload, as a caller may: moving must not leave copies behind.
    moved = {"shards": _shards(inner), "moments": state, "masters": masters}
    expected = sum(_bytes(tensors) for tensors in moved.values())
    policy.offload([ModelPart.PARAMETERS, ModelPart.OPTIMIZER])
    offloaded = _allocated(device) - base
    left = {
        f"{kind}_left_on_device": float(sum(t.device.type != "cpu" for t in tensors))
        for kind, tensors in moved.items()
    }
    on_host = not any(left.values())
    policy.reload([ModelPart.PARAMETERS, ModelPart.OPTIMIZER])
    reloaded = _allocated(device) - base
    policy.backward(policy.module(input_ids=ids, labels=ids).loss)
    assert not policy.step().skipped, "training after reload failed"

    frozen = backend.prepare_frozen(_model())
    with torch.no_grad():
        frozen.module(input_ids=ids)
    assert frozen.engine is not None, "ZeRO-3 frozen models are partitioned by an engine"
    frozen_shards = _bytes(_shards(frozen.engine.module))
    before_frozen = _allocated(device)
    frozen.offload([ModelPart.PARAMETERS])
    frozen_freed = before_frozen - _allocated(device)
    frozen.reload([ModelPart.PARAMETERS])
    return {
        "trained_allocated_mib": trained / MIB,
        "expected_freed_mib": expected / MIB,
        "freed_mib": (trained - offloaded) / MIB,
        "reloaded_allocated_mib": reloaded / MIB,
        "moved_to_host": float(on_host),
        **left,
        "frozen_shards_mib": frozen_shards / MIB,
        "frozen_freed_mib": frozen_freed / MIB,
    }


class TestDeepSpeedMemoryCudaWorld2(DistributedSuite):
    world_size = 2
    device_type = "cuda"

    def test_zero3_offload_frees_parameters_and_optimizer(self, pool: RankPool) -> None:
        figures = pool.run(_zero3_offload_figures)
        print("deepspeed ZeRO-3 offload memory per rank (MiB):", json.dumps(figures))
        for rank, f in enumerate(figures):
            assert f["moved_to_host"] == 1.0, f"rank {rank}: {f}"
            # The shards, the fp32 master partition and AdamW's moments all left the device.
            assert f["freed_mib"] >= 0.95 * f["expected_freed_mib"], f"rank {rank}: {f}"
            # Everything came back, once: no device copy was kept beside the reloaded one.
            assert f["reloaded_allocated_mib"] >= 0.99 * f["trained_allocated_mib"], (
                f"rank {rank}: {f}"
            )
            assert f["reloaded_allocated_mib"] <= 1.01 * f["trained_allocated_mib"], (
                f"rank {rank}: {f}"
            )
            assert f["frozen_freed_mib"] >= 0.95 * f["frozen_shards_mib"], f"rank {rank}: {f}"


class TestDeepSpeedMemoryCudaWorld1(TestDeepSpeedMemoryCudaWorld2):
    world_size = 1
