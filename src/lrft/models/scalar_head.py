"""A transformers model with a one-output linear head on a causal-LM backbone: PPO's critic (a
token-classification model, one value per position) and ``lrft train-rm``'s scalar reward model (a
sequence-classification model, one score per sequence) load the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import PretrainedConfig, PreTrainedModel

from lrft.api.errors import ConfigError


def init_value_head(head: torch.nn.Linear, seed: int) -> None:
    """Deterministic small weights and a zero bias: the same on every rank whatever the global RNG
    did before, and values near 0 at the start with a gradient that reaches the backbone."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        weight = torch.randn(head.weight.shape, generator=generator, dtype=torch.float64)
        head.weight.copy_(weight / (head.in_features + 1))
        if head.bias is not None:
            head.bias.zero_()


def load_with_scalar_head(
    auto_class: Any,
    path: str | Path,
    config: PretrainedConfig,
    *,
    dtype: torch.dtype,
    head_name: str,
    flag: str,
    form: str,
    purpose: str,
    seed: int,
    attn_implementation: str | None = None,
) -> PreTrainedModel:
    """``auto_class.from_pretrained(path)`` whose head ``head_name`` is one-output linear: its
    backbone's weights must all load; a head the folder lacks starts from
    :func:`init_value_head`. ``flag`` (the option that named the folder), ``form``
    (``"token-classification"``) and ``purpose`` (``"the value head"``) word the errors;
    ``attn_implementation`` is transformers' attention kernel (``None``: its default)."""
    info: dict[str, Any]
    try:
        model, info = auto_class.from_pretrained(
            path,
            config=config,
            dtype=dtype,
            output_loading_info=True,
            attn_implementation=attn_implementation,
        )
    except ValueError as error:
        raise ConfigError(
            f"{flag} {str(path)!r}: a {config.model_type!r} model has no {form} form in "
            f"transformers to carry {purpose} ({error})"
        ) from error
    head = getattr(model, head_name, None)
    if not isinstance(head, torch.nn.Linear) or head.out_features != 1:
        raise ConfigError(
            f"{flag} {str(path)!r}: {type(model).__name__} has no one-output linear "
            f"'{head_name}' head"
        )
    missing = set(info["missing_keys"])
    head_names = {f"{head_name}.{name}" for name, _ in head.named_parameters()}
    backbone_missing = sorted(missing - head_names)
    if backbone_missing:
        raise ConfigError(
            f"{flag} {str(path)!r} lacks backbone weights {backbone_missing[:5]} "
            f"({len(backbone_missing)} missing)"
        )
    if missing & head_names:
        init_value_head(head, seed)
    loaded: PreTrainedModel = model
    return loaded
