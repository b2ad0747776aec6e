"""Chunked token logprobs equal ``log_softmax(linear(h) / T).gather`` in value and gradient."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from lrft.algo import chunked_token_logprobs, logprobs


def _inputs(
    seed: int, rows: int, hidden: int, vocab: int, *, bias: bool, dtype: torch.dtype
) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, hidden, generator=generator, dtype=torch.float64).to(dtype)
    w = (torch.randn(vocab, hidden, generator=generator, dtype=torch.float64) * 0.3).to(dtype)
    b = torch.randn(vocab, generator=generator, dtype=torch.float64).to(dtype) if bias else None
    targets = torch.randint(0, vocab, (rows,), generator=generator)
    return (
        h.requires_grad_(),
        w.requires_grad_(),
        b.requires_grad_() if b is not None else None,
        targets,
    )


def _plain(h: Tensor, w: Tensor, b: Tensor | None, targets: Tensor, temperature: float) -> Tensor:
    logits = F.linear(h, w, b).float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(1, targets[:, None])[:, 0]


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_values_and_gradients_equal_the_plain_computation(
    chunk: int, bias: bool, temperature: float
) -> None:
    h, w, b, targets = _inputs(chunk, 13, 8, 37, bias=bias, dtype=torch.float32)
    upstream = torch.randn(13, generator=torch.Generator().manual_seed(9))
    params = [t for t in (h, w, b) if t is not None]

    got = chunked_token_logprobs(h, w, b, targets, temperature=temperature, chunk_tokens=chunk)
    got_grads = torch.autograd.grad((got * upstream).sum(), params)
    expected = _plain(h, w, b, targets, temperature)
    expected_grads = torch.autograd.grad((expected * upstream).sum(), params)

    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    for mine, reference in zip(got_grads, expected_grads, strict=True):
        torch.testing.assert_close(mine, reference, rtol=1e-5, atol=1e-6)


def test_bf16_weights_keep_the_plain_dtypes() -> None:
    """The head's matmul runs in the weight's dtype and the softmax in fp32, as in the plain
    path; gradients come back in the inputs' dtypes, close to the plain bf16 ones."""
    h, w, _, targets = _inputs(1, 20, 16, 50, bias=False, dtype=torch.bfloat16)
    got = chunked_token_logprobs(h, w, None, targets, chunk_tokens=6)
    grad_h, grad_w = torch.autograd.grad(got.sum(), [h, w])
    expected = _plain(h, w, None, targets, 1.0)
    ref_h, ref_w = torch.autograd.grad(expected.sum(), [h, w])
    assert (grad_h.dtype, grad_w.dtype) == (torch.bfloat16, torch.bfloat16)
    torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-3)
    # bf16 rounding of partial sums differs with the chunking: compare relative norms
    for mine, reference in ((grad_h, ref_h), (grad_w, ref_w)):
        error = (mine.double() - reference.double()).norm() / reference.double().norm()
        assert error < 1e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_the_fused_chunk_functions_equal_the_plain_computation(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, bias: bool, temperature: float
) -> None:
    """The two functions CUDA runs compiled, run eagerly here through the same autograd path
    (tests/gpu/test_fused_logprobs_gpu.py runs them compiled on CUDA)."""
    monkeypatch.setattr(logprobs, "fused_kernels", lambda hidden: True)
    monkeypatch.setattr(
        logprobs, "_compiled", lambda: (logprobs._picked_and_lse, logprobs._logits_grad)
    )
    h, w, b, targets = _inputs(5, 11, 8, 37, bias=bias, dtype=dtype)
    upstream = torch.randn(11, generator=torch.Generator().manual_seed(4))
    params = [t for t in (h, w, b) if t is not None]

    got = chunked_token_logprobs(h, w, b, targets, temperature=temperature, chunk_tokens=4)
    got_grads = torch.autograd.grad((got * upstream).sum(), params)
    expected = _plain(h, w, b, targets, temperature)
    expected_grads = torch.autograd.grad((expected * upstream).sum(), params)

    rtol, atol = (1e-5, 1e-6) if dtype == torch.float32 else (1e-3, 1e-3)
    torch.testing.assert_close(got, expected, rtol=rtol, atol=atol)
    for mine, reference in zip(got_grads, expected_grads, strict=True):
        assert mine.dtype == dtype
        if dtype == torch.float32:
            torch.testing.assert_close(mine, reference, rtol=rtol, atol=atol)
        else:  # bf16 partial sums round differently with the chunking
            error = (mine.double() - reference.double()).norm() / reference.double().norm()
            assert error < 1e-2


def test_a_matches_a_hand_computed_value() -> None:
    hidden = torch.tensor([[1.0, 0.0]])
    weight = torch.tensor([[2.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    got = chunked_token_logprobs(hidden, weight, None, torch.tensor([0]), temperature=2.0)
    # logits / T = [1, 0, -0.5]; log p_0 = 1 - log(e + 1 + e^-0.5)
    expected = 1.0 - torch.log(torch.tensor(2.718281828 + 1.0 + 0.60653066))
    assert got.item() == pytest.approx(expected.item(), abs=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"chunk_tokens": 0}, r"chunk_tokens must be >= 1, got 0"),
        ({"temperature": 0.0}, r"temperature must be > 0, got 0.0"),
    ],
)
def test_bad_settings_are_named(kwargs: dict[str, float], message: str) -> None:
    h, w, _, targets = _inputs(0, 4, 4, 5, bias=False, dtype=torch.float32)
    with pytest.raises(ValueError, match=message):
        chunked_token_logprobs(h, w, None, targets, **kwargs)  # type: ignore[arg-type]


def test_shapes_must_agree() -> None:
    h, w, _, targets = _inputs(0, 4, 4, 5, bias=False, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"hidden must be \(N, H\) and targets \(N,\)"):
        chunked_token_logprobs(h, w, None, targets[:3])
