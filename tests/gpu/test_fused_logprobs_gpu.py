"""Chunked token logprobs on CUDA, where each chunk's elementwise work runs compiled: values and
gradients against the plain fp32 computation and against the eager chunked path.

Skipped with a reason where CUDA is missing (CI has none).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from lrft.algo import chunked_token_logprobs, logprobs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DEVICE = torch.device("cuda", 0)


def _inputs(dtype: torch.dtype, *, bias: bool) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
    generator = torch.Generator().manual_seed(0)
    rows, hidden, vocab = 700, 256, 5003  # 3 chunks of 256, the last one short; an odd vocab
    h = torch.randn(rows, hidden, generator=generator)
    w = torch.randn(vocab, hidden, generator=generator) * 0.1
    b = torch.randn(vocab, generator=generator) if bias else None
    targets = torch.randint(0, vocab, (rows,), generator=generator)

    def leaf(t: Tensor) -> Tensor:
        return t.to(DEVICE, dtype).requires_grad_()

    return leaf(h), leaf(w), None if b is None else leaf(b), targets.to(DEVICE)


def _values_and_grads(
    h: Tensor, w: Tensor, b: Tensor | None, targets: Tensor, temperature: float
) -> tuple[Tensor, list[Tensor]]:
    params = [t for t in (h, w, b) if t is not None]
    upstream = torch.linspace(-1.0, 1.0, h.shape[0], device=DEVICE)
    got = chunked_token_logprobs(h, w, b, targets, temperature=temperature, chunk_tokens=256)
    return got, list(torch.autograd.grad((got * upstream).sum(), params))


def _plain(
    h: Tensor, w: Tensor, b: Tensor | None, targets: Tensor, temperature: float
) -> tuple[Tensor, list[Tensor]]:
    params = [t for t in (h, w, b) if t is not None]
    upstream = torch.linspace(-1.0, 1.0, h.shape[0], device=DEVICE)
    logits = F.linear(h, w, b).float() / temperature
    got = torch.log_softmax(logits, dim=-1).gather(1, targets[:, None])[:, 0]
    return got, list(torch.autograd.grad((got * upstream).sum(), params))


def _relative_error(mine: Tensor, reference: Tensor) -> float:
    return float((mine.double() - reference.double()).norm() / reference.double().norm())


def test_cuda_uses_the_compiled_functions() -> None:
    assert logprobs.fused_kernels(torch.empty(1, device=DEVICE))
    assert not logprobs.fused_kernels(torch.empty(1))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("bias", [False, True])
def test_fp32_equals_the_plain_computation(temperature: float, bias: bool) -> None:
    h, w, b, targets = _inputs(torch.float32, bias=bias)
    got, grads = _values_and_grads(h, w, b, targets, temperature)
    expected, expected_grads = _plain(h, w, b, targets, temperature)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    for mine, reference in zip(grads, expected_grads, strict=True):
        assert _relative_error(mine, reference) < 1e-4


def test_bf16_is_as_close_to_fp32_as_the_eager_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 weights: the compiled path is at most as far from the fp32 computation as the eager
    chunked path is (both round the head's matmul and the gradient to bf16)."""
    h, w, _, targets = _inputs(torch.bfloat16, bias=False)
    fused, fused_grads = _values_and_grads(h, w, None, targets, 1.0)
    monkeypatch.setattr(logprobs, "fused_kernels", lambda hidden: False)
    eager, eager_grads = _values_and_grads(h, w, None, targets, 1.0)
    h32, w32 = (t.detach().float().requires_grad_() for t in (h, w))
    exact, exact_grads = _plain(h32, w32, None, targets, 1.0)
    assert _relative_error(fused, exact) <= 1.5 * _relative_error(eager, exact) + 1e-6
    for mine, theirs, reference in zip(fused_grads, eager_grads, exact_grads, strict=True):
        assert mine.dtype == torch.bfloat16
        assert _relative_error(mine, reference) <= 1.5 * _relative_error(theirs, reference) + 1e-4
        assert _relative_error(mine, reference) < 2e-2
