"""Model FLOPs of a training step, the numerator of MFU.

For one sequence of ``S`` tokens of which ``R`` are response tokens, forward plus backward:

``6 * N_body * S  +  6 * V * H * R  +  6 * L * H * S^2``

- ``N_body``: the parameters of the decoder layers and final norm (every matmul weight a token
  passes through, excluding the embedding table, whose lookup is no matmul);
- ``V * H``: the output head, applied only to response tokens (lrft never computes logits at
  prompt positions);
- ``6 * L * H * S^2``: attention scores and weighted values (``2 * 2 * S^2 * H`` per layer
  forward, halved because the mask is causal, times 3 for forward and backward), with ``H``
  the model width (heads x head dim).

Each matmul of ``m x k`` by ``k x n`` counts ``2 m k n``; backward counts twice the forward.
Recomputation (gradient checkpointing) is not counted: MFU measures useful work.
"""

from __future__ import annotations

from lrft.bench.workloads import ModelSpec


def embedding_parameters(spec: ModelSpec) -> int:
    return spec.vocab_size * spec.hidden_size


def layer_parameters(spec: ModelSpec) -> int:
    """One Qwen2 decoder layer: q/k/v (with biases), o, gate/up/down, two RMSNorm weights."""
    hidden, kv = spec.hidden_size, spec.num_key_value_heads * spec.head_dim
    attention = hidden * hidden + hidden + 2 * (hidden * kv + kv) + hidden * hidden
    mlp = 3 * hidden * spec.intermediate_size
    return attention + mlp + 2 * hidden


def body_parameters(spec: ModelSpec) -> int:
    """``N_body``: every decoder layer plus the final norm."""
    return spec.num_hidden_layers * layer_parameters(spec) + spec.hidden_size


def total_parameters(spec: ModelSpec) -> int:
    head = 0 if spec.tie_word_embeddings else embedding_parameters(spec)
    return embedding_parameters(spec) + body_parameters(spec) + head


def training_flops(spec: ModelSpec, *, sequence_tokens: float, response_tokens: float) -> float:
    """Forward + backward FLOPs of one sequence (see the module docstring)."""
    body = 6.0 * body_parameters(spec) * sequence_tokens
    head = 6.0 * embedding_parameters(spec) * response_tokens
    attention = 6.0 * spec.num_hidden_layers * spec.hidden_size * sequence_tokens**2
    return body + head + attention


FORMULA = "6*N_body*S + 6*V*H*R + 6*L*H*S^2 per sequence (S tokens, R response tokens)"
