"""LoRA on NCCL/CUDA: the LoRA suites on GPUs (fsdp2 at worlds 1 and 2; the direct sync's
in-place path, which lends only the changed weights, at world 1), and the memory of the KL
reference: the actor with its adapters disabled holds no second copy of the base, where a frozen
reference model holds all of it.

Skipped with a reason where too few CUDA devices are visible (CI has none) or peft is missing.
Memory is measured with ``torch.cuda.memory_allocated`` against the bytes of the base's
parameters.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("peft", reason="peft is not installed: pip install 'lrft[lora]'")

from transformers import Qwen2Config, Qwen2ForCausalLM

from lrft.api import OptimizerConfig
from lrft.backends.train.fsdp2 import FSDP2Backend, FSDP2Config
from lrft.backends.train.lora import AdaptersDisabled, LoraSettings, apply_lora
from lrft.testing.distributed import DistributedSuite, RankPool, current_rank_context
from lrft.testing.lora import LoraSyncModels, LoraTrainModels
from tests.conformance.test_direct_sync import DirectSyncSuite
from tests.conformance.test_fsdp2 import FSDP2Suite

MIB = 1024 * 1024


class TestFSDP2LoraCudaWorld1(LoraTrainModels, FSDP2Suite):
    world_size = 1
    device_type = "cuda"


class TestFSDP2LoraCudaWorld2(LoraTrainModels, FSDP2Suite):
    world_size = 2
    device_type = "cuda"


class TestDirectSyncLoraCudaWorld1(LoraSyncModels, DirectSyncSuite):
    world_size = 1
    device_type = "cuda"


def _model(seed: int) -> Qwen2ForCausalLM:
    """~150 M parameters: large enough that a copy of the base is plain in the allocator."""
    config = Qwen2Config(
        vocab_size=32_000,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def _kept_by_forward(module: torch.nn.Module, ids: torch.Tensor) -> int:
    """Bytes still allocated after a no-grad forward of ``module`` (what it holds between
    passes: FSDP2 keeps its root unit's gathered weights for the backward that usually follows)."""
    device = ids.device
    torch.cuda.synchronize(device)
    start = torch.cuda.memory_allocated(device)
    with torch.no_grad():
        module(input_ids=ids).logits.sum().item()
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device) - start


def _reference_memory() -> dict[str, float]:
    device = current_rank_context().device
    backend = FSDP2Backend(FSDP2Config(mixed_precision=True))
    actor = backend.prepare_trainable(
        apply_lora(_model(0), LoraSettings(rank=16, alpha=32)), optimizer=OptimizerConfig(lr=1e-5)
    )
    base_bytes = sum(p.numel() * p.element_size() for p in _model(0).parameters())
    ids = torch.randint(0, 32_000, (4, 256), device=device)
    # The actor's own forward first: what any forward of it leaves allocated is no copy.
    actor_kept = _kept_by_forward(actor.module, ids)
    view_kept = _kept_by_forward(AdaptersDisabled(actor).module, ids)
    torch.cuda.synchronize(device)
    before_frozen = torch.cuda.memory_allocated(device)
    frozen = backend.prepare_frozen(_model(0))
    torch.cuda.synchronize(device)
    frozen_weights = torch.cuda.memory_allocated(device) - before_frozen
    frozen_kept = frozen_weights + _kept_by_forward(frozen.module, ids)
    return {
        "base_mib": base_bytes / MIB,
        "actor_forward_mib": actor_kept / MIB,
        "view_mib": view_kept / MIB,
        "frozen_reference_mib": frozen_kept / MIB,
    }


class TestLoraReferenceMemoryCuda(DistributedSuite):
    world_size = 1
    device_type = "cuda"

    def test_reference_is_the_actor_not_a_copy(self, pool: RankPool) -> None:
        (memory,) = pool.run(_reference_memory)
        print(f"LoRA reference memory on one GPU: {memory}")
        # the view adds nothing past what the actor's own forward keeps; a frozen copy adds the
        # whole base
        assert memory["view_mib"] < 0.01 * memory["base_mib"], memory
        assert memory["frozen_reference_mib"] >= 0.99 * memory["base_mib"], memory
