"""Hugging Face export: the actor's full weights as a ``from_pretrained`` folder (safetensors),
and a LoRA actor's adapters as a peft adapter folder."""

from __future__ import annotations

import copy
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import AutoConfig, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from lrft.api.protocols import TrainableModel, WeightSource
from lrft.backends.train.lora import peft_model_of, trainable_parameters
from lrft.models.media import generative_model_class

EXPORT_BUCKET_BYTES = 64 * 2**20
ADAPTER_FILE = "adapter_model.safetensors"
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
LORA_ADAPTER_DIR = "lora_adapter"
"""A LoRA actor's adapters under ``SAVE_PATH`` (``PeftModel.from_pretrained`` on the base
model); written as ``.tmp-lora_adapter`` first."""

ModelFromConfig = Callable[[PretrainedConfig, torch.dtype], PreTrainedModel]
"""Builds the empty model an export loads the gathered weights into."""


def generative_model_from_config(config: PretrainedConfig, dtype: torch.dtype) -> PreTrainedModel:
    """A causal LM, or the image-text-to-text model of a config with a vision tower."""
    model: PreTrainedModel = generative_model_class(config).from_config(config, dtype=dtype)
    return model


def export_hf(
    source: WeightSource,
    *,
    pretrained: str | Path,
    tokenizer: PreTrainedTokenizerBase,
    directory: Path,
    model_config: PretrainedConfig | None = None,
    from_config: ModelFromConfig = generative_model_from_config,
) -> None:
    """Write ``source``'s weights with ``pretrained``'s config (or ``model_config``), the
    tokenizer and (for a vision-language model) the processor's files, as the model
    ``from_config`` builds (the model that generates text unless told). Collective.

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
        for name in PROCESSOR_FILES:
            if (Path(pretrained) / name).is_file():
                shutil.copyfile(Path(pretrained) / name, temporary / name)
        shutil.rmtree(directory, ignore_errors=True)
        temporary.rename(directory)
    if dist.is_initialized():
        dist.barrier()


def export_lora_adapter(actor: TrainableModel, *, pretrained: str | Path, directory: Path) -> None:
    """Write a LoRA actor's adapters as a peft adapter folder (``adapter_config.json``,
    ``adapter_model.safetensors``) for the base model ``pretrained``. Collective.

    Every rank takes part in gathering the adapters; rank 0 alone writes, to a temporary name
    renamed when complete."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    adapters = trainable_parameters(actor)
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        peft_model: Any = peft_model_of(actor.module)
        state = get_peft_model_state_dict(peft_model, state_dict=adapters)
        temporary = directory.with_name(f".tmp-{directory.name}")
        shutil.rmtree(temporary, ignore_errors=True)
        temporary.mkdir(parents=True)
        save_file({k: v.contiguous() for k, v in state.items()}, temporary / ADAPTER_FILE)
        config = copy.deepcopy(peft_model.peft_config["default"])
        config.base_model_name_or_path = str(pretrained)
        config.save_pretrained(str(temporary))
        shutil.rmtree(directory, ignore_errors=True)
        temporary.rename(directory)
    if dist.is_initialized():
        dist.barrier()
