"""Device memory is really released: engine sleep levels 1 and 2, FSDP2 offload, FSDP2's
gather of full weights.

Measured with ``torch.cuda.memory_allocated``/``memory_reserved`` on each rank of a 2-GPU NCCL
pool, on a model large enough (~150 M parameters, ~0.6 GB in fp32) that the released bytes dwarf
the CUDA context and library workspaces. Each check returns its figures; the test prints them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from lrft.api import EnginePart, GenerationRequest, ModelPart, OptimizerConfig, SamplingParams
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.backends.train.fsdp2 import FSDP2Backend, FSDP2Config
from lrft.testing.distributed import DistributedSuite, RankPool, current_rank_context

MIB = 1024 * 1024


def _config() -> Qwen2Config:
    return Qwen2Config(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )


def _model() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    return Qwen2ForCausalLM(_config())


def _mib(value: int) -> float:
    return round(value / MIB, 1)


def _engine_sleep_figures(model_dir: Path) -> dict[str, float]:
    device = current_rank_context().device
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    base_alloc, base_reserved = (
        torch.cuda.memory_allocated(device),
        torch.cuda.memory_reserved(device),
    )
    engine = HFRolloutEngine.from_pretrained(
        model_dir, config=HFEngineConfig(device=device, dtype=torch.float32, max_batch_size=64)
    )
    requests = [GenerationRequest(prompt_token_ids=range(5, 69)) for _ in range(64)]
    params = SamplingParams(temperature=0.0, max_new_tokens=64, return_logprobs=True)
    before = engine.generate(requests, params)
    torch.cuda.synchronize(device)
    awake_alloc = torch.cuda.memory_allocated(device) - base_alloc
    awake_reserved = torch.cuda.memory_reserved(device) - base_reserved
    engine.sleep(1)
    level1_alloc = torch.cuda.memory_allocated(device) - base_alloc
    level1_reserved = torch.cuda.memory_reserved(device) - base_reserved
    engine.wake()
    after = engine.generate(requests, params)
    assert [r.output_token_ids for r in after] == [r.output_token_ids for r in before]
    engine.sleep(2)
    level2_alloc = torch.cuda.memory_allocated(device) - base_alloc
    level2_reserved = torch.cuda.memory_reserved(device) - base_reserved
    engine.wake([EnginePart.WEIGHTS])
    woken_alloc = torch.cuda.memory_allocated(device) - base_alloc
    engine.shutdown()
    return {
        "awake_allocated_mib": _mib(awake_alloc),
        "awake_reserved_mib": _mib(awake_reserved),
        "level1_allocated_mib": _mib(level1_alloc),
        "level1_reserved_mib": _mib(level1_reserved),
        "level2_allocated_mib": _mib(level2_alloc),
        "level2_reserved_mib": _mib(level2_reserved),
        "level2_woken_weights_mib": _mib(woken_alloc),
        "level1_freed_fraction": 1 - level1_reserved / awake_reserved,
        "level2_freed_fraction": 1 - level2_reserved / awake_reserved,
    }


def _fsdp2_offload_figures() -> dict[str, float]:
    device = current_rank_context().device
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    policy = FSDP2Backend(FSDP2Config()).prepare_trainable(
        _model(), optimizer=OptimizerConfig(lr=1e-5)
    )
    ids = torch.randint(0, 32000, (2, 128), device=device)
    policy.backward(policy.module(input_ids=ids, labels=ids).loss)
    assert not policy.step().skipped
    torch.cuda.synchronize(device)
    trained = torch.cuda.memory_allocated(device) - base
    policy.offload([ModelPart.PARAMETERS, ModelPart.OPTIMIZER])
    torch.cuda.synchronize(device)
    offloaded = torch.cuda.memory_allocated(device) - base
    policy.reload([ModelPart.PARAMETERS, ModelPart.OPTIMIZER])
    torch.cuda.synchronize(device)
    reloaded = torch.cuda.memory_allocated(device) - base
    policy.backward(policy.module(input_ids=ids, labels=ids).loss)
    assert not policy.step().skipped, "training after reload failed"
    return {
        "trained_allocated_mib": _mib(trained),
        "offloaded_allocated_mib": _mib(offloaded),
        "reloaded_allocated_mib": _mib(reloaded),
        "freed_fraction": 1 - offloaded / trained,
    }


def _full_weights_figures() -> tuple[dict[str, float], list[str]]:
    """Device memory of two full passes of FSDP2's gather (the second reuses the first's plans):
    the peak above what the model holds, the largest bucket, and what stays allocated after;
    and the tensors of those passes, and of a third one with the parameters offloaded to the
    host, that differ from the unsharded model's parameters cast to bf16."""
    device = current_rank_context().device
    reference = {
        name: p.detach().to(device, torch.bfloat16) for name, p in _model().named_parameters()
    }
    frozen = FSDP2Backend(FSDP2Config()).prepare_frozen(_model())
    figures: dict[str, float] = {}
    wrong: list[str] = []
    largest = 0
    for attempt in ("first", "second", "offloaded"):
        if attempt == "offloaded":
            frozen.offload([ModelPart.PARAMETERS])
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        for bucket in frozen.full_weights(32 * MIB, gather_dtype=torch.bfloat16):
            largest = max(largest, sum(t.numel() * t.element_size() for _, t in bucket))
            wrong += [f"{attempt}: {n}" for n, t in bucket if not torch.equal(t, reference[n])]
        torch.cuda.synchronize(device)
        figures[f"{attempt}_peak_mib"] = _mib(torch.cuda.max_memory_allocated(device) - base)
        figures[f"{attempt}_after_mib"] = _mib(torch.cuda.memory_allocated(device) - base)
    figures["largest_bucket_mib"] = _mib(largest)
    return figures, wrong


class TestDeviceMemoryCudaWorld2(DistributedSuite):
    world_size = 2
    device_type = "cuda"

    @pytest.fixture(scope="class")
    @classmethod
    def model_dir(cls, tmp_path_factory: pytest.TempPathFactory) -> Path:
        directory = tmp_path_factory.mktemp("gpu-memory-model")
        _model().save_pretrained(directory)
        return directory

    def test_engine_sleep_frees_device_memory(self, pool: RankPool, model_dir: Path) -> None:
        figures = pool.run(_engine_sleep_figures, model_dir)
        print("engine sleep memory per rank:", json.dumps(figures))
        for rank, f in enumerate(figures):
            # level 1: the KV cache and every other cached block go; the hf engine also parks
            # its weights on the host, so all of its memory is released
            assert f["level1_freed_fraction"] >= 0.9, f"rank {rank}: {f}"
            assert f["level2_freed_fraction"] >= 0.9, f"rank {rank}: {f}"

    def test_fsdp2_offload_frees_parameters_and_optimizer(self, pool: RankPool) -> None:
        figures = pool.run(_fsdp2_offload_figures)
        print("fsdp2 offload memory per rank:", json.dumps(figures))
        for rank, f in enumerate(figures):
            assert f["freed_fraction"] >= 0.9, f"rank {rank}: {f}"
            # everything is back (a few MiB of allocator rounding and workspaces aside)
            assert f["reloaded_allocated_mib"] >= 0.99 * f["trained_allocated_mib"], (
                f"rank {rank}: {f}"
            )

    def test_fsdp2_full_weights_exact_holds_two_buckets_at_most_and_nothing_after(
        self, pool: RankPool
    ) -> None:
        results = pool.run(_full_weights_figures)
        print("fsdp2 full_weights memory per rank:", json.dumps([f for f, _ in results]))
        for rank, (f, wrong) in enumerate(results):
            assert wrong == [], f"rank {rank}"
            # two buckets in flight at most, each with its send buffer (half a bucket at world 2)
            bound = 2 * 1.5 * f["largest_bucket_mib"] + 4
            for attempt in ("first", "second", "offloaded"):
                assert f[f"{attempt}_peak_mib"] <= bound, f"rank {rank}: {f}"
                assert f[f"{attempt}_after_mib"] <= 0.5, f"rank {rank}: {f}"
