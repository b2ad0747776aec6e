"""Log-probabilities of chosen tokens straight from hidden states, a chunk of tokens at a time.

The plain computation, ``log_softmax(lm_head(h).float() / T).gather(target)``, materialises a
``tokens x vocab`` fp32 matrix (and autograd keeps it, and the log-softmax output, for
backward): 64 responses of 256 tokens over a 152 k vocabulary hold 10 GB per copy. Here the
head is applied to ``chunk_tokens`` rows at a time, only each row's log-sum-exp (4 bytes) is kept,
and backward recomputes each chunk's logits. The result and its gradients are those of the plain
computation, with the same dtypes at each step (the head's matmul in the weight's dtype, the
softmax in fp32); only the summation order of the weight gradient changes (chunk partial sums,
accumulated in fp32).

On CUDA the per-chunk elementwise work (the fp32 cast, log-sum-exp and pick in forward; softmax,
one-hot and cast back in backward) runs as two ``torch.compile``'d functions, each one kernel
that reads the chunk's logits once: the eager sequence makes about ten passes over a
``rows x vocab`` fp32 matrix, which on a 152 k vocabulary costs more time than the head's
matmuls. Elsewhere it runs eagerly, in place, with the least memory.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

DEFAULT_CHUNK_TOKENS = 2048
"""Rows per chunk: at a 152 k vocabulary one chunk's fp32 logits take 1.2 GB."""


def _chunk_logits(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, temperature: float
) -> Tensor:
    """A fresh fp32 ``(rows, vocab)`` tensor: the callers update it in place, so that a chunk
    holds one vocabulary-wide matrix at a time (plus the head's own output when it is bf16)."""
    logits = F.linear(hidden, weight, bias).float()
    return logits.div_(temperature) if temperature != 1.0 else logits


def _picked_and_lse(logits: Tensor, targets: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    """Each row's ``log_softmax(logits.float() / T)`` at its target, and its log-sum-exp."""
    scaled = logits.float() / temperature
    lse = torch.logsumexp(scaled, dim=-1)
    return scaled.gather(1, targets[:, None])[:, 0] - lse, lse


def _logits_grad(
    logits: Tensor, lse: Tensor, upstream: Tensor, targets: Tensor, temperature: float
) -> Tensor:
    """``upstream * d(picked logprob)/d(logits)`` in the logits' dtype: ``(onehot(t) -
    softmax(logits / T)) * upstream / T``."""
    scaled = logits.float() / temperature
    vocab = torch.arange(logits.shape[1], device=logits.device)
    onehot = (vocab[None, :] == targets[:, None]).float()
    grad = (onehot - torch.exp(scaled - lse[:, None])) * (upstream[:, None] / temperature)
    return grad.to(logits.dtype)


_Stats = Callable[[Tensor, Tensor, float], tuple[Tensor, Tensor]]
_Grad = Callable[[Tensor, Tensor, Tensor, Tensor, float], Tensor]


@functools.cache
def _compiled() -> tuple[_Stats, _Grad]:
    # dynamic: chunk rows vary (the last chunk of a batch, token-budget micro-batches).
    return (
        torch.compile(_picked_and_lse, dynamic=True),
        torch.compile(_logits_grad, dynamic=True),
    )


class _ChunkedTokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        targets: Tensor,
        temperature: float,
        chunk_tokens: int,
    ) -> Tensor:
        rows = hidden.shape[0]
        out = torch.empty(rows, dtype=torch.float32, device=hidden.device)
        lse = torch.empty(rows, dtype=torch.float32, device=hidden.device)
        fused = fused_kernels(hidden)
        for start in range(0, rows, chunk_tokens):
            stop = min(start + chunk_tokens, rows)
            if fused:
                logits = F.linear(hidden[start:stop], weight, bias)
                out[start:stop], lse[start:stop] = _compiled()[0](
                    logits, targets[start:stop], temperature
                )
                continue
            logits = _chunk_logits(hidden[start:stop], weight, bias, temperature)
            torch.logsumexp(logits, dim=-1, out=lse[start:stop])
            picked = logits.gather(1, targets[start:stop, None])[:, 0]
            out[start:stop] = picked - lse[start:stop]
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.temperature = temperature
        ctx.chunk_tokens = chunk_tokens
        ctx.fused = fused
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        temperature: float = ctx.temperature
        chunk_tokens: int = ctx.chunk_tokens
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if need_weight else None
        grad_bias = (
            torch.zeros_like(bias, dtype=torch.float32) if need_bias and bias is not None else None
        )
        grad_out = grad_out.float()
        for start in range(0, hidden.shape[0], chunk_tokens):
            stop = min(start + chunk_tokens, hidden.shape[0])
            chunk = hidden[start:stop]
            # d(x_t - logsumexp(x))/dx = onehot(t) - softmax(x), scaled by the incoming gradient,
            # built in place in the recomputed logits.
            if ctx.fused:
                grad_linear = _compiled()[1](
                    F.linear(chunk, weight, bias),
                    lse[start:stop],
                    grad_out[start:stop],
                    targets[start:stop],
                    temperature,
                ).to(chunk.dtype)
            else:
                upstream = grad_out[start:stop, None]
                grad_logits = _chunk_logits(chunk, weight, bias, temperature)
                grad_logits.sub_(lse[start:stop, None]).exp_().mul_(-upstream)
                grad_logits.scatter_add_(1, targets[start:stop, None], upstream)
                # Back through ``/ temperature`` and the fp32 cast of the head's output.
                if temperature != 1.0:
                    grad_logits.div_(temperature)
                grad_linear = grad_logits.to(chunk.dtype)
            if grad_hidden is not None:
                torch.mm(grad_linear, weight, out=grad_hidden[start:stop])
            if grad_weight is not None:
                if grad_linear.dtype == torch.float32:
                    grad_weight.addmm_(grad_linear.t(), chunk)
                else:
                    grad_weight += (grad_linear.t() @ chunk).float()
            if grad_bias is not None:
                grad_bias += grad_linear.float().sum(0)
        return (
            grad_hidden,
            None if grad_weight is None else grad_weight.to(weight.dtype),
            None if grad_bias is None else grad_bias.to(bias.dtype),
            None,
            None,
            None,
        )


def fused_kernels(hidden: Tensor) -> bool:
    """Whether the chunks' elementwise work runs compiled (on CUDA) or eagerly (elsewhere)."""
    return hidden.is_cuda


def chunked_token_logprobs(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    targets: Tensor,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> Tensor:
    """(N,) fp32: ``log_softmax(linear(hidden, weight, bias).float() / temperature)[n, targets[n]]``.

    ``hidden`` is (N, H), ``weight`` (V, H), ``bias`` (V,) or ``None``, ``targets`` (N,) token ids.
    Differentiable in ``hidden``, ``weight`` and ``bias``; never holds more than ``chunk_tokens``
    rows of logits (forward or backward).
    """
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(
            f"hidden must be (N, H) and targets (N,), got {tuple(hidden.shape)} and "
            f"{tuple(targets.shape)}"
        )
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    result: Tensor = _ChunkedTokenLogprobs.apply(  # type: ignore[no-untyped-call]  # unannotated in torch
        hidden, weight, bias, targets.long(), float(temperature), int(chunk_tokens)
    )
    return result
