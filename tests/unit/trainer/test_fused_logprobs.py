"""Response logprobs through the intercepted head equal the plain full-logits computation (values
and every parameter's gradient), on a plain model and on FSDP2 shards; heads that transform
their logits take the plain path."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from lrft.api.types import GenerationResult
from lrft.testing.distributed import DistributedSuite, RankPool, current_rank_context
from lrft.testing.models import tiny_causal_lm
from lrft.trainer.logprobs import output_head, plain_response_logprobs, response_logprobs
from lrft.trainer.sequences import Sequences, pack

CPU = torch.device("cpu")
PROMPTS = [[5, 6, 7], [10], [3, 4], [40, 41, 42, 43]]
OUTPUTS = [[8, 9], [11, 12, 13, 14], [5], [50, 51, 52]]


def _sequences() -> Sequences:
    return pack(
        [
            GenerationResult(
                request_id=str(i),
                sample_index=0,
                prompt_token_ids=prompt,
                output_token_ids=output,
                finish_reason="length",
            )
            for i, (prompt, output) in enumerate(zip(PROMPTS, OUTPUTS, strict=True))
        ]
    )


def _weights(sequences: Sequences) -> Tensor:
    # Distinct weights per token, so a gradient routed to the wrong position shows.
    generator = torch.Generator().manual_seed(3)
    return torch.randn(sequences.action_mask.shape, generator=generator)


def _values_and_grads(
    model: torch.nn.Module, fused: bool, chunk_tokens: int = 2
) -> tuple[Tensor, list[Tensor]]:
    sequences = _sequences()
    if fused:
        values = response_logprobs(
            model, sequences, temperature=0.7, device=CPU, chunk_tokens=chunk_tokens
        )
    else:
        values = plain_response_logprobs(model, sequences, temperature=0.7, device=CPU)
    loss = (values * _weights(sequences)).sum()
    grads = torch.autograd.grad(loss, [p for p in model.parameters()])
    return values.detach(), [g.detach() for g in grads]


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("chunk_tokens", [1, 4, 1000])
def test_fused_equals_plain_values_and_gradients(tied: bool, chunk_tokens: int) -> None:
    model = tiny_causal_lm(0, tie_word_embeddings=tied)
    assert output_head(model) is not None
    got, got_grads = _values_and_grads(model, fused=True, chunk_tokens=chunk_tokens)
    expected, expected_grads = _values_and_grads(model, fused=False)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert got[~_sequences().action_mask].abs().sum() == 0
    for mine, reference in zip(got_grads, expected_grads, strict=True):
        assert _relative_error(mine, reference) < 1e-5


def _relative_error(got: Tensor, expected: Tensor) -> float:
    """||got - expected|| / ||expected||: fp32 sums in another order land far below 1e-5."""
    scale = expected.double().norm().clamp(min=1e-30)
    return float((got.double() - expected.double()).norm() / scale)


def test_plain_path_matches_a_per_row_forward() -> None:
    model = tiny_causal_lm(1)
    values = plain_response_logprobs(model, _sequences(), temperature=0.7, device=CPU)
    for row, (prompt, output) in enumerate(zip(PROMPTS, OUTPUTS, strict=True)):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + output])).logits[0].double() / 0.7
        expected = [
            torch.log_softmax(logits[len(prompt) + t - 1], -1)[token].item()
            for t, token in enumerate(output)
        ]
        assert values[row, : len(output)].tolist() == pytest.approx(expected, abs=1e-5)


def test_the_head_is_restored_after_the_call() -> None:
    model = tiny_causal_lm(0)
    response_logprobs(model, _sequences(), temperature=1.0, device=CPU)
    head = output_head(model)
    assert head is not None
    assert not head._forward_hooks
    assert not head._forward_pre_hooks
    hidden = torch.randn(2, 3, 64)
    assert head(hidden).shape == (2, 3, 256)


def test_transformed_logits_take_the_plain_path() -> None:
    model = tiny_causal_lm(0)
    model.config.final_logit_softcapping = 30.0
    assert output_head(model) is None
    got = response_logprobs(model, _sequences(), temperature=1.0, device=CPU)
    expected = plain_response_logprobs(model, _sequences(), temperature=1.0, device=CPU)
    torch.testing.assert_close(got, expected)


# ------------------------------------------------------------------ FSDP2 shards (world 2, gloo)


def _fsdp2_fused_and_plain(tied: bool) -> tuple[float, float]:
    """On each rank: the largest difference between the fused and plain paths, in values and in
    this rank's gradient shards, with the model sharded by the fsdp2 backend."""
    from lrft.api.optim import OptimizerConfig
    from lrft.backends.train.fsdp2 import FSDP2Backend

    current_rank_context()
    results = {}
    for fused in (True, False):
        model = tiny_causal_lm(0, tie_word_embeddings=tied)
        actor = FSDP2Backend().prepare_trainable(model, optimizer=OptimizerConfig(lr=1e-3))
        assert output_head(actor.module) is not None
        sequences = _sequences()
        if fused:
            values = response_logprobs(actor.module, sequences, temperature=0.7, device=CPU)
        else:
            values = plain_response_logprobs(actor.module, sequences, temperature=0.7, device=CPU)
        actor.backward((values * _weights(sequences)).sum())
        grads = [p.grad.to_local().clone() for p in actor.module.parameters()]  # type: ignore[union-attr]
        results[fused] = (values.detach(), grads)
    values_gap = (results[True][0] - results[False][0]).abs().max().item()
    grads_gap = max(
        (a - b).abs().max().item() if a.numel() else 0.0
        for a, b in zip(results[True][1], results[False][1], strict=True)
    )
    return values_gap, grads_gap


class TestFusedOnFSDP2World2(DistributedSuite):
    world_size = 2

    @pytest.mark.parametrize("tied", [False, True])
    def test_sharded_head_gradients_equal_the_plain_path(self, pool: RankPool, tied: bool) -> None:
        for values_gap, grads_gap in pool.run(_fsdp2_fused_and_plain, tied):
            assert values_gap < 1e-5
            assert grads_gap < 1e-5
