"""The static loop's KV cache: every row at its own column, and rows refilled on their own.

transformers' ``StaticCache`` writes every row of a batch at one cache position, so rows that
started together must advance together. This cache is passed to the model in its place and
writes what the attention layers hand to ``update``:

- in a decode step (one new token per row, the batch being the cache's first rows), row ``i``'s
  key and value at column ``columns[i]``, a device tensor the loop advances; it returns the
  rows' whole cache, which lrft's attention cuts to the mask's width;
- inside ``prefilling(rows)`` (a prompt per row, eager), the prompts' keys and values into the
  given rows from column 0, returning just them: a prompt attends to itself only, and the
  columns a row held before are never visible again (the loop's mask starts each row at its
  own first column and ends at the column it last wrote).

It holds its tensors from the start, at fixed addresses, so that a captured CUDA graph can write
them. Only ``update`` is served: the loop always passes position ids and a 4D mask, so
transformers asks the cache for nothing else (transformers 5.17 calls
``update(key, value, layer_idx)``, 5.24 adds keyword arguments; both are accepted).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers import Cache, PreTrainedConfig


class RowCache(Cache):
    """Keys and values of ``rows`` sequences of up to ``length`` columns, per layer."""

    def __init__(
        self,
        config: PreTrainedConfig,
        *,
        rows: int,
        length: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        super().__init__(layers=[])
        text = config.get_text_config()
        heads = int(text.num_attention_heads)
        kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
        shape = (rows, kv_heads, length, head_dim)
        # zeros, not empty: a masked column still enters the attention products, and garbage
        # bits could be NaN
        self.layer_keys = [
            torch.zeros(shape, dtype=dtype, device=device) for _ in range(text.num_hidden_layers)
        ]
        self.layer_values = [torch.zeros_like(keys) for keys in self.layer_keys]
        self.columns = torch.zeros(rows, dtype=torch.long, device=device)
        self._prefill_rows: torch.Tensor | None = None

    @contextmanager
    def prefilling(self, rows: torch.Tensor) -> Iterator[None]:
        """Within the block, ``update`` writes prompts into ``rows`` (a device index tensor)."""
        self._prefill_rows = rows
        try:
            yield
        finally:
            self._prefill_rows = None

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        layer_idx: int,
        *args: Any,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store one layer's new keys and values ``(rows, kv_heads, tokens, head_dim)``; return
        what the layer attends to."""
        keys, values = self.layer_keys[layer_idx], self.layer_values[layer_idx]
        if self._prefill_rows is not None:
            width = key_states.shape[2]
            keys[:, :, :width].index_copy_(0, self._prefill_rows, key_states)
            values[:, :, :width].index_copy_(0, self._prefill_rows, value_states)
            return key_states, value_states
        rows, kv_heads, _, head_dim = key_states.shape
        index = self.columns[:rows].view(rows, 1, 1, 1).expand(rows, kv_heads, 1, head_dim)
        keys[:rows].scatter_(2, index, key_states)
        values[:rows].scatter_(2, index, value_states)
        return keys[:rows], values[:rows]

    def move_rows(self, sources: torch.Tensor, targets: torch.Tensor) -> None:
        """Copy rows ``sources`` of every layer onto rows ``targets`` (disjoint index tensors)."""
        for keys, values in zip(self.layer_keys, self.layer_values, strict=True):
            keys.index_copy_(0, targets, keys.index_select(0, sources))
            values.index_copy_(0, targets, values.index_select(0, sources))

    def get_seq_length(self, layer_idx: int = 0) -> int:
        # transformers asks for it only to make position ids, which the loop always passes
        raise NotImplementedError("RowCache rows have lengths of their own")
