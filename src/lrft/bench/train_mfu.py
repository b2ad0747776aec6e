"""The training part: the trainer's policy update alone, on synthetic sequences, as MFU.

The model is wrapped by the ``fsdp2`` backend and trained by the trainer's own
:class:`~lrft.trainer.policy.PolicyUpdate` over a :class:`~lrft.trainer.replay.ReplayBuffer`
holding one iteration of on-policy experience: random prompt and response tokens of fixed
lengths and random advantages. One timed step is one optimizer step over every sequence (so
``sequences / micro_train_batch_size`` forward/backward passes per rank).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from lrft.api.optim import OptimizerConfig
from lrft.api.protocols import TrainableModel
from lrft.backends.train.fsdp2 import FSDP2Backend, FSDP2Config
from lrft.bench import flops
from lrft.bench.assets import FIRST_WORD_ID, random_model
from lrft.bench.ceilings import synchronize
from lrft.bench.workloads import TrainMfuSpec, Workload
from lrft.dist import RankInfo, init_distributed
from lrft.models.packed_attention import use_packed_attention
from lrft.trainer.experience import ExperienceBatch
from lrft.trainer.policy import PolicyUpdate
from lrft.trainer.replay import ReplayBuffer
from lrft.trainer.sequences import Sequences


def synthetic_experience(spec: TrainMfuSpec, vocab_size: int, *, seed: int) -> ExperienceBatch:
    """``spec.sequences`` rows of random prompt + response tokens, full length, on-policy."""
    generator = torch.Generator().manual_seed(seed)
    rows, prompt, response = spec.sequences, spec.prompt_tokens, spec.response_tokens
    width = prompt + response
    input_ids = torch.randint(FIRST_WORD_ID, vocab_size, (rows, width), generator=generator)
    sequences = Sequences(
        input_ids=input_ids,
        attention_mask=torch.ones((rows, width), dtype=torch.long),
        prompt_lengths=torch.full((rows,), prompt),
        action_mask=torch.ones((rows, response), dtype=torch.bool),
        action_tokens=input_ids[:, prompt:].clone(),
    )
    return ExperienceBatch(
        sequences=sequences,
        old_logprobs=None,
        ref_logprobs=None,
        scores=torch.zeros(rows),
        advantages=torch.randn((rows, response), generator=generator),
    )


def wrapped_actor(workload: Workload, *, packed: bool = False) -> TrainableModel:
    """The workload's random model wrapped by the ``fsdp2`` backend as the train part sets it
    up; ``packed``: set up for packed rows (``lrft.models.packed_attention``). Collective."""
    spec = workload.train_mfu
    assert spec is not None
    backend = FSDP2Backend(
        FSDP2Config(
            reshard_after_forward=spec.fsdp_reshard_after_forward,
            defer_gradient_sync=spec.fsdp_defer_gradient_sync,
        )
    )
    model = random_model(workload.model, backend.device)
    if packed:
        use_packed_attention(model)
    if spec.gradient_checkpointing:
        model.gradient_checkpointing_enable()  # type: ignore[no-untyped-call]  # unannotated in transformers
    return backend.prepare_trainable(model, optimizer=OptimizerConfig(lr=1e-6))


def run_train_mfu(workload: Workload, *, steps: int | None, matmul_tflops: float) -> dict[str, Any]:
    """Wrap the model, run the warm-up and timed optimizer steps, report MFU. Collective."""
    spec = workload.train_mfu
    assert spec is not None
    info = init_distributed(RankInfo.from_env())
    actor = wrapped_actor(workload)
    buffer = ReplayBuffer(seed=0)
    buffer.append(synthetic_experience(spec, workload.model.vocab_size, seed=info.rank))
    update = PolicyUpdate(
        micro_batch_size=spec.micro_train_batch_size,
        accumulation=spec.sequences // spec.micro_train_batch_size,
        epochs=1,
        temperature=1.0,
    )
    device = info.device
    for step in range(spec.warmup_steps):
        update.run(actor, buffer, step=step, device=device)
    timed = steps if steps is not None else spec.steps
    seconds = []
    for step in range(timed):
        synchronize(device)
        began = time.perf_counter()
        update.run(actor, buffer, step=spec.warmup_steps + step, device=device)
        synchronize(device)
        seconds.append(time.perf_counter() - began)
    median = statistics.median(seconds)
    sequence = spec.prompt_tokens + spec.response_tokens
    tokens = spec.sequences * sequence * info.world_size
    step_flops = (
        spec.sequences
        * info.world_size
        * flops.training_flops(
            workload.model, sequence_tokens=sequence, response_tokens=spec.response_tokens
        )
    )
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    return {
        "parameters": flops.total_parameters(workload.model),
        "sequences_per_step": spec.sequences * info.world_size,
        "tokens_per_sequence": sequence,
        "micro_train_batch_size": spec.micro_train_batch_size,
        "gradient_checkpointing": spec.gradient_checkpointing,
        "fsdp_reshard_after_forward": spec.fsdp_reshard_after_forward,
        "fsdp_defer_gradient_sync": spec.fsdp_defer_gradient_sync,
        "step_seconds": seconds,
        "step_seconds_median": median,
        "train_tokens_per_s": tokens / median,
        "train_flops_per_step": step_flops,
        "achieved_tflops_per_device": step_flops / median / info.world_size / 1e12,
        "train_mfu": step_flops / median / (info.world_size * matmul_tflops * 1e12),
        "peak_memory_mib": peak,
    }
