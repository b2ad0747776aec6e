"""The training part on ragged responses: the policy update padded and packed, side by side.

With ``train_mfu.ragged`` set, each rank's ``sequences`` rows have responses of lengths drawn
log-uniformly from ``ragged.min_tokens`` to ``ragged.max_tokens`` (:func:`lrft.bench.ragged
.drawn_lengths`, drawn for the rank) after prompts of ``prompt_tokens``. The same micro-batches
(``micro_train_batch_size`` shuffled rows, the trainer's own) are trained in one run by two
freshly wrapped copies of the same random model: padded to their longest row (the default),
then packed end to end (``--packing_samples``: :mod:`lrft.trainer.packing`). Trained tokens are
real tokens (prompt and response, no padding); the padding fraction is the share of padded
tokens in the padded forwards. The two take turns step by step, so that a busy machine slows
both alike.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from lrft.bench import flops
from lrft.bench.assets import FIRST_WORD_ID
from lrft.bench.ceilings import synchronize
from lrft.bench.ragged import drawn_lengths
from lrft.bench.train_mfu import wrapped_actor
from lrft.bench.workloads import TrainMfuSpec, Workload
from lrft.dist import RankInfo, init_distributed, sum_over_ranks
from lrft.trainer.experience import ExperienceBatch
from lrft.trainer.packing import PADDED, TokenLayout
from lrft.trainer.policy import PolicyUpdate
from lrft.trainer.replay import ReplayBuffer
from lrft.trainer.sequences import Sequences

LAYOUTS = (("padded", PADDED), ("packed", TokenLayout(packed=True)))


def ragged_experience(spec: TrainMfuSpec, vocab_size: int, *, rank: int) -> ExperienceBatch:
    """``spec.sequences`` rows of random tokens with ragged responses, on-policy."""
    assert spec.ragged is not None
    responses = drawn_lengths(spec.ragged, rank, spec.sequences)
    generator = torch.Generator().manual_seed(spec.ragged.seed * 1000 + rank)
    rows, prompt, steps = spec.sequences, spec.prompt_tokens, max(responses)
    input_ids = torch.randint(
        FIRST_WORD_ID, vocab_size, (rows, prompt + steps), generator=generator
    )
    attention = torch.zeros((rows, prompt + steps), dtype=torch.long)
    action_mask = torch.zeros((rows, steps), dtype=torch.bool)
    for row, length in enumerate(responses):
        attention[row, : prompt + length] = 1
        action_mask[row, :length] = True
    input_ids = input_ids * attention
    sequences = Sequences(
        input_ids=input_ids,
        attention_mask=attention,
        prompt_lengths=torch.full((rows,), prompt),
        action_mask=action_mask,
        action_tokens=input_ids[:, prompt:] * action_mask,
    )
    return ExperienceBatch(
        sequences=sequences,
        old_logprobs=None,
        ref_logprobs=None,
        scores=torch.zeros(rows),
        advantages=torch.randn((rows, steps), generator=generator) * action_mask,
    )


def _padded_tokens(buffer: ReplayBuffer, micro_batch_size: int) -> int:
    """The tokens of one epoch's padded forwards: each micro-batch's rows x its longest row."""
    lengths = buffer.row_lengths()
    return sum(
        len(rows) * int(lengths[rows].max())
        for rows in buffer.row_groups(micro_batch_size, epoch=0)
    )


def _prepared_update(
    workload: Workload, layout: TokenLayout, batch: ExperienceBatch, device: torch.device
) -> Callable[[int], object]:
    """One optimizer step over ``batch`` in ``layout`` (called with the step's index) on a
    freshly wrapped copy of the workload's model."""
    spec = workload.train_mfu
    assert spec is not None
    actor = wrapped_actor(workload, packed=layout.packed)
    buffer = ReplayBuffer(seed=0)
    buffer.append(batch)
    update = PolicyUpdate(
        micro_batch_size=spec.micro_train_batch_size,
        accumulation=spec.sequences // spec.micro_train_batch_size,
        epochs=1,
        temperature=1.0,
        layout=layout,
    )
    return lambda step: update.run(actor, buffer, step=step, device=device)


def _interleaved_seconds(
    workload: Workload, batch: ExperienceBatch, steps: int, device: torch.device
) -> dict[str, list[float]]:
    """Each layout's seconds per timed step, the two taking turns step by step (each going
    first every other step), so that both meet the same machine."""
    spec = workload.train_mfu
    assert spec is not None
    runs = {name: _prepared_update(workload, layout, batch, device) for name, layout in LAYOUTS}
    for step in range(spec.warmup_steps):
        for run in runs.values():
            run(step)
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for step in range(steps):
        order = list(runs) if step % 2 == 0 else list(reversed(runs))
        for name in order:
            synchronize(device)
            began = time.perf_counter()
            runs[name](spec.warmup_steps + step)
            synchronize(device)
            seconds[name].append(time.perf_counter() - began)
    return seconds


def run_ragged_train(
    workload: Workload, *, steps: int | None, matmul_tflops: float
) -> dict[str, Any]:
    """Both updates on the same ragged rows; the figures of each and the packed one's speed-up.
    Collective."""
    spec = workload.train_mfu
    assert spec is not None
    assert spec.ragged is not None
    info = init_distributed(RankInfo.from_env())
    batch = ragged_experience(spec, workload.model.vocab_size, rank=info.rank)
    buffer = ReplayBuffer(seed=0)
    buffer.append(batch)
    sequences = batch.sequences
    device = info.device
    per_row = zip(
        sequences.attention_mask.sum(-1).tolist(),
        sequences.action_mask.sum(-1).tolist(),
        strict=True,
    )
    work = sum(
        flops.training_flops(workload.model, sequence_tokens=length, response_tokens=response)
        for length, response in per_row
    )
    real, padded, step_flops = sum_over_ranks(
        [
            float(sequences.attention_mask.sum()),
            float(_padded_tokens(buffer, spec.micro_train_batch_size)),
            work,
        ],
        device,
    )
    timed = steps if steps is not None else spec.steps
    result: dict[str, Any] = {
        "parameters": flops.total_parameters(workload.model),
        "sequences_per_step": spec.sequences * info.world_size,
        "prompt_tokens": spec.prompt_tokens,
        "response_tokens": {"min": spec.ragged.min_tokens, "max": spec.ragged.max_tokens},
        "micro_train_batch_size": spec.micro_train_batch_size,
        "real_tokens_per_step": real,
        "padded_tokens_per_step": padded,
        "padding_fraction": 1.0 - real / padded,
        "train_flops_per_step": step_flops,
    }
    for name, seconds in _interleaved_seconds(workload, batch, timed, device).items():
        median = statistics.median(seconds)
        result[name] = {
            "step_seconds": seconds,
            "step_seconds_median": median,
            "train_tokens_per_s": real / median,
            "train_mfu": step_flops / median / (info.world_size * matmul_tflops * 1e12),
        }
    result["packed_speedup"] = (
        result["packed"]["train_tokens_per_s"] / result["padded"]["train_tokens_per_s"]
    )
    return result
