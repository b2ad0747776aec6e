"""How vLLM's parameters map to Hugging Face tensors: a fused vLLM parameter (q/k/v, gate/up)
holds several Hugging Face tensors, and a tensor-parallel shard holds a slice of each."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from lrft.api.errors import ConfigError


@attrs.frozen(kw_only=True)
class VLLMParam:
    """One vLLM parameter and the Hugging Face tensors it holds."""

    vllm_name: str
    kind: str
    hf_names: tuple[str, ...]
    local_sizes: tuple[int, ...]  # rows of each piece in this rank's shard (fused only)
    kv_replicas: int
    org_vocab_size: int | None


def describe_param(entry: Mapping[str, Any]) -> VLLMParam:
    """The :class:`VLLMParam` of one entry of the worker's parameter description."""
    module, param_name = entry["module"], entry["param"]
    pieces = entry.get("pieces")
    if pieces:
        parent = module.rsplit(".", 1)[0]
        hf_names = tuple(f"{parent}.{piece}.{param_name}" for piece in pieces)
        if len(entry["local_sizes"]) != len(pieces):
            raise ConfigError(f"vLLM module {module!r}: cannot split {entry['local_sizes']}")
    else:
        hf_names = (f"{module}.{param_name}",)
    return VLLMParam(
        vllm_name=f"{module}.{param_name}",
        kind=entry["kind"],
        hf_names=hf_names,
        local_sizes=tuple(entry.get("local_sizes", ())) if pieces else (),
        kv_replicas=int(entry.get("kv_replicas", 1)),
        org_vocab_size=entry.get("org_vocab_size"),
    )


def full_shape(param: VLLMParam, local: tuple[int, ...], tp: int, index: int) -> tuple[int, ...]:
    """The full (unsharded) shape of piece ``index`` of ``param``, whose rank-local shard has
    shape ``local`` in a tensor-parallel group of ``tp``."""
    if param.local_sizes:
        rows = param.local_sizes[index] * tp
        if param.kind == "QKVParallelLinear" and index > 0:
            rows //= param.kv_replicas
        return (rows, *local[1:])
    if param.org_vocab_size is not None:
        return (param.org_vocab_size, *local[1:])
    if param.kind == "ColumnParallelLinear":
        return (local[0] * tp, *local[1:])
    if param.kind == "RowParallelLinear" and param.vllm_name.endswith(".weight"):
        return (local[0], local[1] * tp)
    return local
