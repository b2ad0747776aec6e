"""Independent references the conformance suites compare backends with.

Deliberately naive: a full forward pass per generated token (no KV cache, no padding, no
``generate``), plain ``torch.optim.AdamW`` training on one process. What they compute is easy to
read and shares no code with the backends under test.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel


def load_reference_model(model_dir: Path, device: torch.device | str = "cpu") -> PreTrainedModel:
    """The plain transformers model in ``model_dir`` in fp32, in eval mode."""
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    # PreTrainedModel re-declares eval/to without annotations; the nn.Module ones are typed.
    torch.nn.Module.eval(model)
    torch.nn.Module.to(model, device)
    return model


def model_with_weights(model_dir: Path, weights: Mapping[str, torch.Tensor]) -> PreTrainedModel:
    """The architecture in ``model_dir`` with every parameter replaced by ``weights`` (fp32)."""
    model = load_reference_model(model_dir)
    names = {name for name, _ in model.named_parameters()}
    if set(weights) != names:
        raise ValueError(
            f"weights do not match the model's parameters: missing {sorted(names - set(weights))}, "
            f"unexpected {sorted(set(weights) - names)}"
        )
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.copy_(weights[name].to(torch.float32))
    return model


@torch.no_grad()
def greedy_continuation(
    model: torch.nn.Module, prompt: Sequence[int], max_new_tokens: int
) -> list[int]:
    """Greedy tokens after ``prompt``: argmax of a full forward pass, one token at a time."""
    device = next(model.parameters()).device
    ids = list(prompt)
    for _ in range(max_new_tokens):
        logits = model(torch.tensor([ids], device=device)).logits[0, -1]
        ids.append(int(torch.argmax(logits).item()))
    return ids[len(prompt) :]


@torch.no_grad()
def token_distributions(
    model: torch.nn.Module, prompt: Sequence[int], output: Sequence[int], temperature: float = 1.0
) -> torch.Tensor:
    """``log_softmax(logits / temperature)`` over the vocabulary at each output position given
    everything before it: shape ``(len(output), vocab)``, float64."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt) + list(output)], device=device)
    logits = model(ids).logits[0, len(prompt) - 1 : -1].double() / temperature
    return torch.log_softmax(logits, dim=-1)


def token_logprobs(
    model: torch.nn.Module, prompt: Sequence[int], output: Sequence[int], temperature: float = 1.0
) -> list[float]:
    """``log_softmax(logits / temperature)`` of each output token given everything before it."""
    distributions = token_distributions(model, prompt, output, temperature)
    tokens = torch.tensor(list(output), dtype=torch.long, device=distributions.device)
    chosen = distributions.gather(1, tokens[:, None])
    return [float(x) for x in chosen[:, 0].tolist()]
