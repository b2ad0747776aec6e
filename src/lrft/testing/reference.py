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

from lrft.api.media import ProcessedMedia


def load_reference_model(model_dir: Path, device: torch.device | str = "cpu") -> PreTrainedModel:
    """The plain transformers model in ``model_dir`` in fp32, in eval mode."""
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    # PreTrainedModel re-declares eval/to without annotations; the nn.Module ones are typed.
    torch.nn.Module.eval(model)
    torch.nn.Module.to(model, device)
    return model


def model_with_weights(model_dir: Path, weights: Mapping[str, torch.Tensor]) -> PreTrainedModel:
    """The architecture in ``model_dir`` with every parameter replaced by ``weights`` (fp32): a
    causal LM, or a vision- or audio-language model where the folder holds its processor."""
    if (model_dir / "processor_config.json").is_file():
        model = load_reference_vlm(model_dir)
    else:
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


# --- prompts with media ---------------------------------------------------------------------------


def load_reference_vlm(model_dir: Path, device: torch.device | str = "cpu") -> PreTrainedModel:
    """The plain transformers vision- or audio-language model in ``model_dir`` in fp32, in eval
    mode: the class its config names (``architectures``: ``Qwen2VLForConditionalGeneration``,
    ``Qwen2AudioForConditionalGeneration``), or transformers' image-text-to-text auto class."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(model_dir)
    names = getattr(config, "architectures", None) or []
    loader = getattr(transformers, names[0], None) if names else None
    if loader is None:
        loader = transformers.AutoModelForImageTextToText
    model: PreTrainedModel = loader.from_pretrained(model_dir, dtype=torch.float32)
    torch.nn.Module.eval(model)
    torch.nn.Module.to(model, device)
    return model


def _media_forward(
    model: torch.nn.Module, media: ProcessedMedia, ids: Sequence[int]
) -> torch.Tensor:
    """Logits ``(len(ids), vocab)`` of one unpadded sequence: the prompt of ``media`` and what
    follows it, with every media tensor; the model places the tokens itself (m-RoPE included)
    from the per-token tensors, extended with zeros (text) over the tokens after the prompt."""
    device = next(model.parameters()).device
    extra = len(ids) - len(media.prompt_token_ids)
    kwargs = {name: tensor.to(device) for name, tensor in media.tensors.items()}
    for name, values in media.token_tensors.items():
        padded = torch.cat([values, values.new_zeros(extra)])
        kwargs[name] = padded[None].to(device)
    logits: torch.Tensor = model(
        input_ids=torch.tensor([list(ids)], device=device), **kwargs
    ).logits
    return logits[0]


def media_placeholder_ids(model: torch.nn.Module) -> list[int]:
    """The image and video placeholder ids of a Qwen2-VL-family config and the audio one of a
    Qwen2-Audio config, which engines never sample (a response holding one could not be read
    back with its prompt's media)."""
    config = getattr(model, "config", None)
    names = ("image_token_id", "video_token_id", "audio_token_index")
    ids = {getattr(config, name, None) for name in names}
    return sorted(int(i) for i in ids if i is not None)


@torch.no_grad()
def media_greedy_continuation(
    model: torch.nn.Module, media: ProcessedMedia | None, prompt: Sequence[int], max_new_tokens: int
) -> list[int]:
    """Greedy tokens after ``prompt`` (``media``'s expanded prompt, or a text prompt with
    ``media`` ``None``): argmax of a full forward per token, the placeholders masked out."""
    never = media_placeholder_ids(model)
    device = next(model.parameters()).device
    ids = list(prompt)
    for _ in range(max_new_tokens):
        if media is None:
            logits = model(input_ids=torch.tensor([ids], device=device)).logits[0, -1]
        else:
            logits = _media_forward(model, media, ids)[-1]
        logits[never] = float("-inf")
        ids.append(int(torch.argmax(logits).item()))
    return ids[len(prompt) :]


@torch.no_grad()
def media_token_logprobs(
    model: torch.nn.Module, media: ProcessedMedia, output: Sequence[int], temperature: float = 1.0
) -> list[float]:
    """``log_softmax(logits / temperature)`` of each output token after ``media``'s prompt."""
    prompt = len(media.prompt_token_ids)
    logits = _media_forward(model, media, [*media.prompt_token_ids, *output])
    logprobs = torch.log_softmax(logits[prompt - 1 : -1].double() / temperature, dim=-1)
    tokens = torch.tensor(list(output), dtype=torch.long, device=logprobs.device)
    return [float(x) for x in logprobs.gather(1, tokens[:, None])[:, 0].tolist()]
