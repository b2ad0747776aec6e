"""The PPO critic's model: a causal-LM backbone with a scalar value head, loaded as transformers'
token-classification model with one label (a Qwen2-VL critic as
:class:`~lrft.models.vision_critic.Qwen2VLForValues`, which transformers lacks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForTokenClassification, PreTrainedModel

from lrft.models.scalar_head import load_with_scalar_head

VALUE_HEAD = "score"
"""The value head's module name (transformers' token-classification heads use it)."""


def load_critic(
    path: str | Path,
    *,
    seed: int,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str | None = None,
) -> PreTrainedModel:
    """The critic for ``path``: a causal LM folder (new value head) or a saved critic.

    ``attn_implementation``: transformers' attention kernel (``None``: its default).
    Raises ``ConfigError`` when the folder's architecture has no token-classification form in
    transformers, or when backbone weights are missing from it.
    """
    config = AutoConfig.from_pretrained(path)
    config.num_labels = 1
    # Dropout on the values would make the critic's outputs differ between the experience pass
    # and the update, so the clipped value loss would compare two noisy numbers.
    config.classifier_dropout = 0.0
    return load_with_scalar_head(
        _critic_class(config),
        path,
        config,
        dtype=dtype,
        head_name=VALUE_HEAD,
        flag="critic_pretrain",
        form="token-classification",
        purpose="the value head",
        seed=seed,
        attn_implementation=attn_implementation,
    )


def _critic_class(config: Any) -> Any:
    """The class of ``config``'s critic: transformers' token-classification model, or for a
    Qwen2-VL :class:`~lrft.models.vision_critic.Qwen2VLForValues` (transformers has none)."""
    if getattr(config, "vision_config", None) is None:
        return AutoModelForTokenClassification
    from lrft.models.vision_critic import VISION_CRITIC_TYPES, Qwen2VLForValues

    if config.model_type not in VISION_CRITIC_TYPES:  # refused by name when it loads
        return AutoModelForTokenClassification
    return Qwen2VLForValues
