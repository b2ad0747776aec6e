"""Hugging Face export: the actor's full weights as a ``from_pretrained`` folder (safetensors)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoConfig, PreTrainedTokenizerBase

from lrft.api.protocols import WeightSource
from lrft.backends.media import generative_model_class

EXPORT_BUCKET_BYTES = 64 * 2**20
HF_MODEL_DIR = "hf_model"
"""The exported model's folder under ``SAVE_PATH``; written as ``.tmp-hf_model`` first."""
PROCESSOR_FILES = (
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
    "chat_template.jinja",
    "chat_template.json",
)
"""A vision-language model's processor files, copied from the pretrained folder as they are."""


def export_hf(
    source: WeightSource,
    *,
    pretrained: str | Path,
    tokenizer: PreTrainedTokenizerBase,
    directory: Path,
) -> None:
    """Write ``source``'s weights with ``pretrained``'s config, the tokenizer and (for a
    vision-language model) the processor's files. Collective.

    Every rank iterates ``full_weights``; rank 0 alone writes, to a temporary name renamed when
    complete. Weights come only from ``full_weights``, whatever the backend.
    """
    rank = dist.get_rank() if dist.is_initialized() else 0
    state: dict[str, torch.Tensor] = {}
    for bucket in source.full_weights(EXPORT_BUCKET_BYTES):
        if rank == 0:
            state.update((name, tensor.detach().to("cpu", copy=True)) for name, tensor in bucket)
    if rank == 0:
        config = AutoConfig.from_pretrained(pretrained)
        dtype = next(iter(state.values())).dtype
        model = generative_model_class(config).from_config(config, dtype=dtype)
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
        for name in PROCESSOR_FILES:
            if (Path(pretrained) / name).is_file():
                shutil.copyfile(Path(pretrained) / name, temporary / name)
        shutil.rmtree(directory, ignore_errors=True)
        temporary.rename(directory)
    if dist.is_initialized():
        dist.barrier()
