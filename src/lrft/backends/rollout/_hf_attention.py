"""The attention the ``hf`` engine's static loop runs: SDPA over the key/value heads as they are,
and over the cache columns its mask covers.

transformers' ``sdpa`` attention expands the key/value heads to the query heads (``repeat_kv``)
whenever a mask is passed, which the static loop always does (its rows are left-padded), and
attends to every column of the static cache. For a grouped-query model that is most of a decode
step at real sizes: on an H200, 128 rows of the Qwen2.5-1.5B shape at a 1152-column cache spend
about 32 ms a step in the expanded attention, against about 1.1 ms with SDPA's own grouped-query
support (``enable_gqa``). This function is the same computation without either cost:

- ``enable_gqa=True``: each key/value head serves its group of query heads in place;
- a mask narrower than the cache (``(rows, 1, queries, columns)`` with ``columns`` below the
  cache's length) means the later columns are not attended to at all: the keys and values are
  cut to ``columns`` first, so a decode step reads the live part of the cache only.

It is registered with transformers under ``GQA_SDPA`` and set on the models the static loop
decodes with; anything else about attention (scaling, causality without a mask, dropout) is
what transformers' ``sdpa`` does.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

GQA_SDPA = "lrft_gqa_sdpa"


def gqa_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query`` is ``(rows, heads, queries, dim)``,
    ``key``/``value`` ``(rows, kv_heads, columns, dim)``; returns ``(rows, queries, heads, dim)``."""
    if attention_mask is not None:
        # Cut unconditionally (a no-op at the full width): comparing the widths would make
        # torch.compile specialise the step's dynamic width to the cache's length.
        columns = attention_mask.shape[-1]
        key, value = key[:, :, :columns], value[:, :, :columns]
    if is_causal is None:
        is_causal = bool(getattr(module, "is_causal", True))
    output = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout if module.training else 0.0,
        scale=scaling,
        # without a mask, a causal layer's queries see the columns up to their own
        is_causal=is_causal and attention_mask is None and query.shape[2] > 1,
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return output.transpose(1, 2).contiguous(), None


AttentionInterface.register(GQA_SDPA, gqa_sdpa_attention)
# The masks transformers builds from a 2-D padding mask: those it builds for ``sdpa`` (without
# one, it would build none, and padding would be attended to).
AttentionMaskInterface.register(GQA_SDPA, sdpa_mask)


def use_gqa_sdpa(model: torch.nn.Module) -> None:
    """Switch ``model`` from transformers' ``sdpa`` to ``GQA_SDPA`` (the same results); other
    implementations are left as they are."""
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "_attn_implementation", None) == "sdpa":
        config._attn_implementation = GQA_SDPA
