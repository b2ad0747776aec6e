"""The rank-side bodies of ``TrainBackendSuite``'s packing and sequence-parallel checks.

A backend that declares ``packed_sequences`` trains a model set up by
:func:`lrft.models.packed_attention.use_packed_attention` on packed rows of ragged sequences;
one that declares ``sequence_parallel`` also trains it with each packed row split over a
sequence-parallel group. Both are compared with a plain copy of the model run the padded way
on the whole batch: per-token logprobs (and, on the full-logits path, entropy) and loss at 1e-5,
each step's gradient norm at 1e-4 relative, the parameters after the steps at 1e-5.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from lrft.algo import entropy_from_logits
from lrft.api.protocols import TrainableModel, TrainBackend
from lrft.api.types import GenerationResult
from lrft.dist.sequence_parallel import SequenceParallelLayout
from lrft.models.packed_attention import use_packed_attention
from lrft.testing.conformance._train_checks import (
    OPTIMIZER,
    PARITY_ATOL,
    SCHEDULE,
    Reference,
    assert_close,
    check_report_matches,
)
from lrft.testing.conformance._train_hooks import TrainBackendHooks
from lrft.testing.conformance._train_ranks import require
from lrft.trainer.experience import response_logits, response_logprobs, token_logprobs
from lrft.trainer.packing import PADDED, TokenLayout
from lrft.trainer.sequences import Sequences, pack

Suite = type[TrainBackendHooks[Any]]

ROWS_PER_SHARE = 3
STEPS = 2  # the first on the fused-head logprobs, the second on full logits with entropy
TEMPERATURE = 0.8
ENTROPY_COEF = 0.01


def ragged_batch(seed: int, rows: int) -> tuple[Sequences, Tensor]:
    """``rows`` sequences of random tokens (prompts of 1 to 6, responses of 1 to 12; every other
    one with an observation inside its response, which is not trained on), and per-token
    advantages; the same on every rank."""
    generator = torch.Generator().manual_seed(seed)
    results = []
    for row in range(rows):
        prompt, response = (int(torch.randint(1, n, (), generator=generator)) for n in (7, 13))
        results.append(
            GenerationResult(
                request_id=str(row),
                sample_index=0,
                prompt_token_ids=torch.randint(3, 200, (prompt,), generator=generator).tolist(),
                output_token_ids=torch.randint(3, 200, (response,), generator=generator).tolist(),
                finish_reason="length",
            )
        )
    sequences = pack(results)
    # every other row is a multi-turn episode: an observation of two tokens between its turns
    mask = sequences.action_mask.clone()
    lengths = mask.sum(-1)
    for row in range(0, rows, 2):
        if int(lengths[row]) >= 5:
            mask[row, 2:4] = False
    sequences = Sequences(
        input_ids=sequences.input_ids,
        attention_mask=sequences.attention_mask,
        prompt_lengths=sequences.prompt_lengths,
        action_mask=mask,
        action_tokens=sequences.action_tokens.masked_fill(~mask, 0),
        response_lengths=lengths,
    )
    return sequences, torch.randn(mask.shape, generator=generator)


def _share(sequences: Sequences, advantages: Tensor, index: int) -> tuple[Sequences, Tensor]:
    rows = torch.arange(index * ROWS_PER_SHARE, (index + 1) * ROWS_PER_SHARE)
    picked = sequences.select(rows)
    return picked, advantages[rows, : picked.action_mask.shape[1]]


def _forward(
    module: torch.nn.Module,
    sequences: Sequences,
    layout: TokenLayout,
    step: int,
    device: torch.device,
) -> tuple[Tensor, Tensor | None]:
    if step == 0:
        values = response_logprobs(
            module, sequences, temperature=TEMPERATURE, device=device, layout=layout
        )
        return values, None
    logits = response_logits(
        module, sequences, temperature=TEMPERATURE, device=device, layout=layout
    )
    mask = sequences.action_mask.to(device)
    return token_logprobs(logits, sequences), entropy_from_logits(logits, mask)


def _loss(
    sequences: Sequences, advantages: Tensor, logprobs: Tensor, entropy: Tensor | None
) -> Tensor:
    mask = sequences.action_mask.to(logprobs.device)
    count = mask.sum()
    loss = -(logprobs * advantages.to(logprobs.device) * mask).sum() / count
    if entropy is not None:
        loss = loss - ENTROPY_COEF * (entropy * mask).sum() / count
    return loss


def _mean_loss(
    module: torch.nn.Module,
    *,
    batch: tuple[Sequences, Tensor],
    shares: int,
    step: int,
    device: torch.device,
) -> Tensor:
    """The mean of every share's padded loss: what the backend's averaged gradients follow."""
    parts = []
    for index in range(shares):
        sequences, advantages = _share(*batch, index)
        parts.append(
            _loss(sequences, advantages, *_forward(module, sequences, PADDED, step, device))
        )
    return torch.stack(parts).mean()


def _check_close(got: Tensor, expected: Tensor, what: str) -> float:
    diff = float((got.detach().double().cpu() - expected.detach().double().cpu()).abs().max())
    if not diff <= PARITY_ATOL:
        raise AssertionError(
            f"{what} differ from the padded forward of a plain copy of the model: max abs diff "
            f"{diff:.3e} (tolerance {PARITY_ATOL:.0e})"
        )
    return diff


def _train(
    suite: Suite,
    backend: TrainBackend,
    layout: TokenLayout,
    share_index: int,
    shares: int,
    what: str,
) -> float:
    """``STEPS`` steps of ``backend`` on this rank's share (``share_index`` of ``shares``)
    against the plain reference on all of them; the largest difference seen."""
    model = suite.make_model(5)
    use_packed_attention(model)
    trainable: TrainableModel = backend.prepare_trainable(
        model, optimizer=OPTIMIZER, scheduler=SCHEDULE
    )
    reference = Reference(suite.make_model(5), backend.device)
    worst = 0.0
    for step in range(STEPS):
        whole, advantages = ragged_batch(2000 + step, ROWS_PER_SHARE * shares)
        mine, my_advantages = _share(whole, advantages, share_index)
        device = backend.device
        logprobs, entropy = _forward(trainable.module, mine, layout, step, device)
        with torch.no_grad():
            expected, expected_entropy = _forward(reference.model, mine, PADDED, step, device)
        worst = max(worst, _check_close(logprobs, expected, f"{what} logprobs at step {step}"))
        if entropy is not None and expected_entropy is not None:
            worst = max(worst, _check_close(entropy, expected_entropy, f"{what} entropy"))
        loss = _loss(mine, my_advantages, logprobs, entropy)
        expected_loss = _loss(mine, my_advantages, expected, expected_entropy)
        worst = max(worst, _check_close(loss, expected_loss, f"{what} loss at step {step}"))
        trainable.backward(loss)
        report = trainable.step()

        whole_loss = partial(
            _mean_loss, batch=(whole, advantages), shares=shares, step=step, device=device
        )
        check_report_matches(report.grad_norm, report.lr, reference.step_on(whole_loss), step)
    parameters = suite.gathered_parameters(trainable)
    worst = max(
        worst,
        assert_close(parameters, reference.parameters(), f"parameters after {STEPS} {what} steps"),
    )
    return worst


def packed_training_matches_padded(suite: Suite) -> float:
    """Every rank trains its own share, packed into one row."""
    backend = suite.make_backend()
    require(backend, "packed_sequences")
    layout = TokenLayout(packed=True)
    return _train(suite, backend, layout, dist.get_rank(), dist.get_world_size(), "packed")


def sequence_parallel_matches_unsplit(suite: Suite, sp_size: int) -> float:
    """Each group of ``sp_size`` ranks trains one share, its packed row split over the group."""
    backend = suite.make_backend()
    require(backend, "packed_sequences")
    require(backend, "sequence_parallel")
    world = dist.get_world_size()
    layout = SequenceParallelLayout(world_size=world, sp_size=sp_size)
    split = TokenLayout(packed=True, group=layout.build_group())
    what = f"sequence-parallel (groups of {sp_size} at world {world})"
    return _train(suite, backend, split, dist.get_rank() // sp_size, layout.dp_size, what)
