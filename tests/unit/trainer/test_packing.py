"""Packed forwards equal padded ones: per-token logprobs (1e-5) and gradients (1e-4) in fp32, for
text rows, Qwen2-VL rows with images (3-D m-RoPE positions per packed sequence) and multi-turn
episodes (action masks with holes); the critic's values and a reward model's scores too.

The padded side is a separately built plain transformers model (sdpa, its own masks) run by the
trainer's padded path, which the existing tests hold to one-sequence-at-a-time references; the
logprobs are also checked against that per-sequence reference directly. A Qwen2-VL critic's
values too.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch
from torch import Tensor

from lrft.api import GenerationResult
from lrft.models.critic import load_critic
from lrft.models.packed_attention import PackedRows, packed_attention, use_packed_attention
from lrft.testing.conformance._rollout_media_checks import MediaPrompt, media_prompts
from lrft.testing.models import tiny_causal_lm
from lrft.testing.reference import load_reference_vlm, media_token_logprobs, token_logprobs
from lrft.testing.vision_models import save_tiny_vlm
from lrft.trainer.critic import response_values
from lrft.trainer.experience import response_logits, response_logprobs
from lrft.trainer.packing import PADDED, TokenLayout
from lrft.trainer.sequences import Sequences, pack

CPU = torch.device("cpu")
PACKED = TokenLayout(packed=True)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def ragged_results(seed: int, shapes: list[tuple[int, int]]) -> list[GenerationResult]:
    """Results of random tokens with (prompt, response) lengths ``shapes``."""
    generator = torch.Generator().manual_seed(seed)
    return [
        GenerationResult(
            request_id=str(index),
            sample_index=0,
            finish_reason="length",
            prompt_token_ids=torch.randint(3, 256, (prompt,), generator=generator).tolist(),
            output_token_ids=torch.randint(3, 256, (response,), generator=generator).tolist(),
        )
        for index, (prompt, response) in enumerate(shapes)
    ]


SHAPES = [(5, 9), (3, 2), (11, 14), (1, 1), (7, 4)]


def packed_copy(model: torch.nn.Module) -> torch.nn.Module:
    twin = copy.deepcopy(model)
    use_packed_attention(twin)
    return twin


def logprobs_and_grads(
    model: torch.nn.Module, sequences: Sequences, layout: TokenLayout, *, fused: bool = True
) -> tuple[Tensor, dict[str, Tensor]]:
    """The response logprobs and the gradient of a fixed weighted sum of them."""
    model.zero_grad(set_to_none=True)
    if fused:
        values = response_logprobs(model, sequences, temperature=0.7, device=CPU, layout=layout)
    else:
        logits = response_logits(model, sequences, temperature=0.7, device=CPU, layout=layout)
        chosen = torch.log_softmax(logits, -1).gather(-1, sequences.action_tokens[..., None])
        values = chosen[..., 0].masked_fill(~sequences.action_mask, 0.0)
    weights = torch.linspace(-1.0, 1.0, values.numel()).reshape(values.shape)
    torch.autograd.backward((values * weights).sum())
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return values.detach(), grads


def assert_packed_equals_padded(
    model: torch.nn.Module, sequences: Sequences, *, fused: bool = True
) -> tuple[float, float]:
    padded, padded_grads = logprobs_and_grads(model, sequences, PADDED, fused=fused)
    twin = packed_copy(model)
    packed, packed_grads = logprobs_and_grads(twin, sequences, PACKED, fused=fused)
    value_diff = float((packed - padded).abs().max())
    assert value_diff <= 1e-5, f"packed logprobs differ from padded ones by {value_diff:.2e}"
    assert set(packed_grads) == set(padded_grads)
    grad_diff = max(float((packed_grads[n] - g).abs().max()) for n, g in padded_grads.items())
    assert grad_diff <= 1e-4, f"packed gradients differ from padded ones by {grad_diff:.2e}"
    return value_diff, grad_diff


@pytest.mark.parametrize("fused", [True, False], ids=["fused-head", "full-logits"])
def test_text_rows_packed_equal_padded_and_the_reference(fused: bool) -> None:
    model = tiny_causal_lm(0)
    results = ragged_results(1, SHAPES)
    sequences = pack(results)
    assert_packed_equals_padded(model, sequences, fused=fused)
    with torch.no_grad():
        packed = response_logprobs(
            packed_copy(model), sequences, temperature=1.0, device=CPU, layout=PACKED
        )
    for row, result in enumerate(results):
        expected = torch.tensor(
            token_logprobs(model, result.prompt_token_ids, result.output_token_ids)
        )
        steps = len(result.output_token_ids)
        assert torch.allclose(packed[row, :steps], expected, atol=1e-5), row


def image_results(prompts: Sequence[MediaPrompt], *, seed: int) -> list[GenerationResult]:
    """A random response of 3, 7, 11, ... tokens to each of ``prompts``."""
    generator = torch.Generator().manual_seed(seed)
    return [
        GenerationResult(
            request_id=prompt.request.request_id,
            sample_index=0,
            finish_reason="length",
            prompt_token_ids=list(prompt.request.prompt_token_ids),
            output_token_ids=torch.randint(3, 200, (3 + 4 * k,), generator=generator).tolist(),
        )
        for k, prompt in enumerate(prompts)
    ]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_vlm(tmp_path_factory.mktemp("vlm") / "model")


def test_image_rows_packed_equal_padded_with_their_own_m_rope_positions(model_dir: Path) -> None:
    prompts = media_prompts(model_dir, rank=0)  # 1, 0, 2 and 1 images
    results = image_results(prompts, seed=5)
    sequences = pack(results, media=[p.processed for p in prompts])
    model = load_reference_vlm(model_dir)
    assert_packed_equals_padded(model, sequences)
    with torch.no_grad():
        packed = response_logprobs(
            packed_copy(model), sequences, temperature=1.0, device=CPU, layout=PACKED
        )
    for row, (prompt, result) in enumerate(zip(prompts, results, strict=True)):
        if prompt.processed is None:
            continue
        expected = media_token_logprobs(model, prompt.processed, result.output_token_ids)
        steps = len(result.output_token_ids)
        assert torch.allclose(packed[row, :steps], torch.tensor(expected), atol=1e-5), row


def test_a_vision_critic_values_packed_image_rows_as_padded_ones(model_dir: Path) -> None:
    prompts = media_prompts(model_dir, rank=0)
    sequences = pack(image_results(prompts, seed=1), media=[p.processed for p in prompts])
    critic = load_critic(str(model_dir), seed=0)
    torch.nn.Module.eval(critic)  # PreTrainedModel re-declares eval without annotations
    head = critic.get_submodule("score")
    assert isinstance(head, torch.nn.Linear)
    torch.nn.init.normal_(head.weight)  # a fresh head may start at zero
    with torch.no_grad():
        padded = response_values(critic, sequences, device=CPU)
        packed = response_values(packed_copy(critic), sequences, device=CPU, layout=PACKED)
    assert float(padded.abs().max()) > 0
    assert float((packed - padded).abs().max()) <= 1e-5


def episode_sequences(seed: int) -> Sequences:
    """Rows whose responses have observation holes in their action masks."""
    sequences = pack(ragged_results(seed, [(4, 12), (6, 7), (2, 15)]))
    mask = sequences.action_mask.clone()
    mask[0, 3:6] = False  # an observation between two turns
    mask[2, 2:5] = False
    mask[2, 9:11] = False
    return Sequences(
        input_ids=sequences.input_ids,
        attention_mask=sequences.attention_mask,
        prompt_lengths=sequences.prompt_lengths,
        action_mask=mask,
        action_tokens=sequences.action_tokens.masked_fill(~mask, 0),
        response_lengths=sequences.action_mask.sum(-1),
    )


def test_episode_rows_packed_equal_padded() -> None:
    assert_packed_equals_padded(tiny_causal_lm(3), episode_sequences(2))


def test_a_row_attends_only_to_itself_whatever_is_packed_beside_it() -> None:
    """A sequence's logprobs are the same alone and packed after any other sequence."""
    model = packed_copy(tiny_causal_lm(0))
    target = ragged_results(7, [(6, 8)])
    others = ragged_results(8, [(9, 5)])
    with torch.no_grad():
        alone = response_logprobs(model, pack(target), temperature=1.0, device=CPU, layout=PACKED)
        packed = response_logprobs(
            model, pack(others + target), temperature=1.0, device=CPU, layout=PACKED
        )
    assert torch.allclose(packed[1, :8], alone[0], atol=1e-6)


def _run_attention(rows: PackedRows | None) -> None:
    query = torch.zeros(1, 4, 6, 8)
    key = value = torch.zeros(1, 2, 6, 8)
    module = torch.nn.Module()
    if rows is None:
        packed_attention(module, query, key, value, None)
    else:
        packed_attention(module, query, key, value, None, lrft_rows=rows)


def test_packed_attention_refuses_a_forward_without_the_rows_boundaries() -> None:
    with pytest.raises(RuntimeError, match=r"needs the forward keyword 'lrft_rows'"):
        _run_attention(None)
    _run_attention(PackedRows.of_lengths([2, 4], CPU))
    with pytest.raises(ValueError, match=r"sequences of >= 1 token, got \[2, 0\]"):
        PackedRows.of_lengths([2, 0], CPU)


def test_a_model_set_up_for_packing_refuses_a_padded_forward() -> None:
    model = packed_copy(tiny_causal_lm(0))
    with pytest.raises(RuntimeError, match=r"lrft_rows"):
        model(input_ids=torch.ones(2, 5, dtype=torch.long))
