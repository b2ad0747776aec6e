"""Padding-free attention over packed rows, split across a sequence-parallel group when asked.

A packed row is several whole sequences laid end to end in one batch row, with no padding
between them. Its boundaries travel with the model's forward as one keyword argument,
``lrft_rows`` (:class:`PackedRows`), which transformers hands unchanged through the model to
every attention call (and through a gradient-checkpointed layer's recomputation, which a
context set around the forward would miss). :func:`use_packed_attention` registers
:func:`packed_attention` with transformers' ``AttentionInterface`` and routes the model's text
attention through it; each sequence then attends causally to itself only:

- on CUDA, in one variable-length kernel (flash-attn's ``flash_attn_varlen_func`` when it is
  installed, else torch's ``varlen_attn``) for bf16 and fp16;
- elsewhere (the CPU, fp32), one ``scaled_dot_product_attention`` per sequence: the same sums
  as the padded forward's, without the padding.

transformers builds no mask for an attention function without a mask function of its own, so
the model spends nothing on an ``N x N`` mask of the packed row. A model routed this way runs
packed rows only: a call without ``lrft_rows`` raises rather than attending across rows.

With a sequence-parallel group in :class:`PackedRows` (Ulysses, :mod:`lrft.dist.sequence_parallel`)
a pre-hook on the text decoder keeps this rank's contiguous share of the row's tokens (ids or
merged embeddings, and their positions), and attention exchanges tokens for heads before the
kernel and back after it. Everything outside attention runs on the share alone.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import attrs
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from transformers import AttentionInterface

from lrft.api.errors import ConfigError
from lrft.dist.sequence_parallel import heads_to_sequence, sequence_to_heads

PACKED_ATTENTION = "lrft_packed"
"""The name :func:`packed_attention` is registered under with transformers."""
ROWS_KWARG = "lrft_rows"
"""The forward keyword that carries a packed row's :class:`PackedRows`."""

PACKING_FAMILIES = ("llama", "qwen2", "qwen3", "qwen2_vl")
"""The ``model_type``s whose packed forward is tested equal to their padded one: their text
attention goes through transformers' ``AttentionInterface`` with the forward's keywords, and
their decoder takes its inputs by keyword."""

_HOOKED = "_lrft_packed_attention"


@attrs.frozen(kw_only=True, eq=False)
class PackedRows:
    """The sequences of one packed row: sequence ``i`` holds tokens ``bounds[i]`` to
    ``bounds[i + 1]`` of the whole row (before any split). ``group``: the sequence-parallel
    group the row is split across (``None``: not split); the row's length is then a multiple
    of the group's size."""

    bounds: tuple[int, ...]
    cu_seqlens: Tensor  # bounds as int32 on the forward's device, for the varlen kernels
    group: dist.ProcessGroup | None = None

    @classmethod
    def of_lengths(
        cls, lengths: Sequence[int], device: torch.device, group: dist.ProcessGroup | None = None
    ) -> PackedRows:
        if not lengths or min(lengths) < 1:
            raise ValueError(f"a packed row needs sequences of >= 1 token, got {list(lengths)}")
        bounds = [0]
        for length in lengths:
            bounds.append(bounds[-1] + int(length))
        rows = cls(
            bounds=tuple(bounds),
            cu_seqlens=torch.tensor(bounds, dtype=torch.int32, device=device),
            group=group,
        )
        if group is not None and rows.tokens % dist.get_world_size(group):
            raise ValueError(
                f"a row of {rows.tokens} tokens does not split over a sequence-parallel group "
                f"of {dist.get_world_size(group)} ranks: pad it to a multiple first"
            )
        return rows

    @property
    def tokens(self) -> int:
        return self.bounds[-1]

    @property
    def max_length(self) -> int:
        return max(b - a for a, b in pairwise(self.bounds))

    def shard(self) -> tuple[int, int]:
        """``[start, stop)``: this rank's tokens of the row (all of them without a group)."""
        if self.group is None:
            return 0, self.tokens
        size = self.tokens // dist.get_world_size(self.group)
        start = dist.get_rank(self.group) * size
        return start, start + size


def packed_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers' attention-function contract: ``query`` (1, heads, tokens, dim), ``key`` and
    ``value`` (1, kv_heads, tokens, dim) of a packed row; returns (1, tokens, heads, dim)."""
    rows = kwargs.get(ROWS_KWARG)
    if not isinstance(rows, PackedRows):
        raise RuntimeError(
            f"{type(module).__name__} runs lrft's packed attention, which needs the forward "
            f"keyword {ROWS_KWARG!r} (the packed row's boundaries); got {type(rows).__name__}"
        )
    if attention_mask is not None or kwargs.get("sliding_window") is not None:
        raise RuntimeError("packed attention takes no attention mask and no sliding window")
    if query.shape[0] != 1:
        raise RuntimeError(f"a packed forward has one row, got {query.shape[0]}")
    if rows.group is not None:
        size = dist.get_world_size(rows.group)
        if key.shape[1] % size:
            # fewer KV heads than ranks: each rank takes the KV heads its query heads read
            repeats = query.shape[1] // key.shape[1]
            key, value = _repeat_heads(key, repeats), _repeat_heads(value, repeats)
        query, key, value = (sequence_to_heads(t, rows.group) for t in (query, key, value))
    out = varlen_causal_attention(
        query, key, value, rows, scale=scaling, dropout=dropout if module.training else 0.0
    )
    if rows.group is not None:
        out = heads_to_sequence(out, rows.group)
    return out.transpose(1, 2).contiguous(), None


def _repeat_heads(x: Tensor, repeats: int) -> Tensor:
    return x if repeats == 1 else x.repeat_interleave(repeats, dim=1)


def varlen_causal_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    rows: PackedRows,
    *,
    scale: float | None,
    dropout: float = 0.0,
) -> Tensor:
    """(1, heads, tokens, dim): each of ``rows``' sequences attending causally to itself only;
    ``key``/``value`` may have fewer heads (grouped-query attention)."""
    if query.is_cuda and query.dtype in (torch.bfloat16, torch.float16):
        fused = _cuda_varlen(query, key, value, rows, scale=scale, dropout=dropout)
        if fused is not None:
            return fused
    repeats = query.shape[1] // key.shape[1]
    key, value = _repeat_heads(key, repeats), _repeat_heads(value, repeats)
    bounds = rows.bounds
    parts = [
        F.scaled_dot_product_attention(
            query[:, :, a:b],
            key[:, :, a:b],
            value[:, :, a:b],
            dropout_p=dropout,
            is_causal=True,
            scale=scale,
        )
        for a, b in pairwise(bounds)
    ]
    return torch.cat(parts, dim=2)


def _cuda_varlen(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    rows: PackedRows,
    *,
    scale: float | None,
    dropout: float,
) -> Tensor | None:
    """flash-attn's or torch's variable-length kernel on (tokens, heads, dim); ``None`` where
    neither is available."""
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))
    cu, longest = rows.cu_seqlens, rows.max_length
    if importlib.util.find_spec("flash_attn") is not None:
        flash: Any = importlib.import_module("flash_attn")
        out: Tensor = flash.flash_attn_varlen_func(
            q, k, v, cu, cu, longest, longest, dropout_p=dropout, softmax_scale=scale, causal=True
        )
        return out.transpose(0, 1)[None]
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    if dropout:
        return None
    options = inspect.signature(varlen_attn).parameters
    extra: dict[str, Any] = {"scale": scale}
    # torch 2.11 spells causality is_causal; 2.13 a window of (-1, 0)
    extra.update({"window_size": (-1, 0)} if "window_size" in options else {"is_causal": True})
    if q.shape[1] != k.shape[1]:
        if "enable_gqa" in options:
            extra["enable_gqa"] = True
        else:
            repeats = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
    fused = varlen_attn(q, k, v, cu, cu, longest, longest, **extra)
    assert isinstance(fused, Tensor)
    return fused.transpose(0, 1)[None]


def check_packing_support(config: Any, sequence_parallel_size: int = 1) -> None:
    """Raise ``ConfigError`` unless a model of Hugging Face ``config`` trains on packed rows
    (and, with ``sequence_parallel_size`` above 1, splits them over that many ranks). Reads the
    config only, so it runs before any model or process group exists."""
    family = getattr(config, "model_type", None)
    if family not in PACKING_FAMILIES:
        raise ConfigError(
            f"packing_samples: model_type {family!r} is not among the families whose packed "
            f"forward lrft has tested equal to the padded one ({', '.join(PACKING_FAMILIES)})"
        )
    text = config.get_text_config()
    layer_types = getattr(text, "layer_types", None) or ()
    if getattr(text, "use_sliding_window", False) or "sliding_attention" in layer_types:
        raise ConfigError(
            f"packing_samples: this {family} model uses sliding-window attention, which lrft's "
            "packed attention does not implement"
        )
    heads = int(text.num_attention_heads)
    if sequence_parallel_size > 1 and heads % sequence_parallel_size:
        raise ConfigError(
            f"sequence_parallel_size {sequence_parallel_size} must divide the model's "
            f"{heads} attention heads (each rank of a sequence-parallel group attends with "
            f"heads / sequence_parallel_size of them; {heads} % {sequence_parallel_size} = "
            f"{heads % sequence_parallel_size})"
        )


def use_packed_attention(model: torch.nn.Module) -> None:
    """Route ``model``'s text attention through :func:`packed_attention` and split its decoder's
    inputs for sequence parallelism when a forward's :class:`PackedRows` has a group. In place,
    once per model; before a train backend wraps it. Raises ``ConfigError`` for a model
    :func:`check_packing_support` refuses."""
    if getattr(model, _HOOKED, False):
        return
    config: Any = getattr(model, "config", None)
    if config is None or not callable(getattr(model, "get_decoder", None)):
        raise ConfigError(f"packing_samples needs a transformers model, got {type(model).__name__}")
    check_packing_support(config)
    AttentionInterface.register(PACKED_ATTENTION, packed_attention)
    text = config.get_text_config()
    # the text config only: a vision tower keeps its own (bidirectional) attention
    text._attn_implementation = PACKED_ATTENTION
    decoder: torch.nn.Module = getattr(model, "get_decoder")()  # noqa: B009  # typed as a Module
    decoder.register_forward_pre_hook(_keep_own_share, with_kwargs=True)
    setattr(model, _HOOKED, True)


def _keep_own_share(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """The decoder's pre-hook: a split row's inputs cut to this rank's tokens (see module)."""
    rows = kwargs.get(ROWS_KWARG)
    if not isinstance(rows, PackedRows) or rows.group is None:
        return None
    if any(isinstance(arg, Tensor) for arg in args[1:]):
        raise RuntimeError(f"{type(module).__name__} was called with positional tensors")
    if kwargs.get("position_ids") is None:
        raise RuntimeError("a sequence-parallel forward needs the row's position_ids")
    start, stop = rows.shard()
    if args and isinstance(args[0], Tensor):  # transformers' decoders take input_ids first
        args = (args[0][:, start:stop], *args[1:])
    for name in ("input_ids", "inputs_embeds"):
        if kwargs.get(name) is not None:
            kwargs[name] = kwargs[name][:, start:stop]
    kwargs["position_ids"] = kwargs["position_ids"][..., start:stop]
    return args, kwargs
