"""Hugging Face export: the actor's full weights as a ``from_pretrained`` folder (safetensors)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from lrft.api.protocols import WeightSource

EXPORT_BUCKET_BYTES = 64 * 2**20
HF_MODEL_DIR = "hf_model"
"""The exported model's folder under ``SAVE_PATH``; written as ``.tmp-hf_model`` first."""

ModelFromConfig = Callable[[PretrainedConfig, torch.dtype], PreTrainedModel]
"""Builds the empty model an export loads the gathered weights into."""


def causal_lm_from_config(config: PretrainedConfig, dtype: torch.dtype) -> PreTrainedModel:
    model: PreTrainedModel = AutoModelForCausalLM.from_config(config, dtype=dtype)  # type: ignore[no-untyped-call]  # transformers leaves from_config unannotated
    return model


def export_hf(
    source: WeightSource,
    *,
    pretrained: str | Path,
    tokenizer: PreTrainedTokenizerBase,
    directory: Path,
    model_config: PretrainedConfig | None = None,
    from_config: ModelFromConfig = causal_lm_from_config,
) -> None:
    """Write ``source``'s weights with ``pretrained``'s config (or ``model_config``) and the
    tokenizer, as the model ``from_config`` builds (a causal LM unless told). Collective.

    Every rank iterates ``full_weights``; rank 0 alone writes, to a temporary name renamed when
    complete. Weights come only from ``full_weights``, whatever the backend.
    """
    rank = dist.get_rank() if dist.is_initialized() else 0
    state: dict[str, torch.Tensor] = {}
    for bucket in source.full_weights(EXPORT_BUCKET_BYTES):
        if rank == 0:
            state.update((name, tensor.detach().to("cpu", copy=True)) for name, tensor in bucket)
    if rank == 0:
        config = (
            model_config if model_config is not None else AutoConfig.from_pretrained(pretrained)
        )
        dtype = next(iter(state.values())).dtype
        model = from_config(config, dtype)
        missing, unexpected = model.load_state_dict(state, strict=False)
        tied = {name for name, _ in model.named_parameters(remove_duplicate=False)} - set(
            dict(model.named_parameters())
        )
        if unexpected or set(missing) - tied:
            raise RuntimeError(
                f"exported weights do not match the model: missing {sorted(missing)}, "
                f"unexpected {sorted(unexpected)}"
            )
        temporary = directory.with_name(f".tmp-{directory.name}")
        shutil.rmtree(temporary, ignore_errors=True)
        model.save_pretrained(temporary)
        tokenizer.save_pretrained(temporary)
        shutil.rmtree(directory, ignore_errors=True)
        temporary.rename(directory)
    if dist.is_initialized():
        dist.barrier()
