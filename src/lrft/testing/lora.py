"""LoRA models for the conformance suites, and the plain merge they are checked against.

:func:`tiny_lora_model` wraps the tiny test model with peft adapters on every linear layer but
the output head, initialised at random (``B`` too), so that the merged weights differ from the
base from the start. :func:`plain_merge` is the reference: it computes a peft model's merged
weights from its parameters by their names and the definition, ``W + (B @ A) * alpha / r``, with
neither peft's merge nor lrft's. Needs peft (``pip install 'lrft[lora]'``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from lrft.testing.models import tiny_causal_lm

LORA_RANK = 4
LORA_ALPHA = 8
LORA_SCALING = LORA_ALPHA / LORA_RANK
_PREFIX = "base_model.model."
_ADAPTER = "default"


def tiny_lora_model(
    seed: int = 0,
    *,
    adapter_seed: int | None = None,
    tie_word_embeddings: bool = False,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
) -> torch.nn.Module:
    """``tiny_causal_lm(seed)`` with rank-4 LoRA adapters (alpha 8) on every linear layer but
    the output head; the adapters' random initial values come from ``adapter_seed`` (unset:
    derived from ``seed``). Only the adapters require grad."""
    from peft import LoraConfig, get_peft_model

    base = tiny_causal_lm(
        seed,
        tie_word_embeddings=tie_word_embeddings,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
    )
    config = LoraConfig(
        r=LORA_RANK,
        lora_alpha=LORA_ALPHA,
        lora_dropout=0.0,
        target_modules="all-linear",
        init_lora_weights=False,  # random A and B: merging changes every adapted weight
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(10_000 + seed if adapter_seed is None else adapter_seed)
        model: torch.nn.Module = get_peft_model(base, config)
    return model


def plain_merge(
    parameters: Mapping[str, torch.Tensor], scaling: float = LORA_SCALING
) -> dict[str, torch.Tensor]:
    """The base model's weights of a peft model whose full-shape parameters are
    ``parameters`` (by peft's names): each adapted module's weight is ``W + (B @ A) * scaling``,
    every other parameter is itself, and the adapters' own parameters are gone."""
    merged: dict[str, torch.Tensor] = {}
    for name, tensor in parameters.items():
        if ".lora_A." in name or ".lora_B." in name:
            continue
        base = name.removeprefix(_PREFIX)
        path, _, leaf = base.rpartition(".")
        if not path.endswith(".base_layer"):
            merged[base] = tensor
            continue
        owner = path.removesuffix(".base_layer")
        if leaf != "weight":
            merged[f"{owner}.{leaf}"] = tensor
            continue
        lora_a = parameters[f"{_PREFIX}{owner}.lora_A.{_ADAPTER}.weight"]
        lora_b = parameters[f"{_PREFIX}{owner}.lora_B.{_ADAPTER}.weight"]
        merged[f"{owner}.weight"] = tensor + (lora_b @ lora_a) * scaling
    return merged


class LoraTrainModels:
    """Mixed in first, runs a ``TrainBackendSuite`` subclass on :func:`tiny_lora_model`: its
    full weights are the plain merge of its parameters, and a checkpoint (adapters only) loads
    into a model of the same base with other adapters."""

    lora = True

    @classmethod
    def make_model(cls, seed: int, *, tie_word_embeddings: bool = False) -> torch.nn.Module:
        return tiny_lora_model(seed, tie_word_embeddings=tie_word_embeddings)

    @classmethod
    def full_weights_of(cls, parameters: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return plain_merge(parameters)

    @classmethod
    def model_for_load(cls, saved_seed: int, fresh_seed: int) -> torch.nn.Module:
        return tiny_lora_model(saved_seed, adapter_seed=fresh_seed)


class LoraSyncModels:
    """Mixed in first, runs a ``WeightSyncSuite`` subclass with a LoRA source: the engine must
    hold the plain merge of the source's parameters (which the subclass's
    ``source_parameters`` backdoor reads)."""

    lora = True
    model_heads: ClassVar[tuple[int, int]]

    @classmethod
    def make_source_model(cls, *, tied: bool = False) -> torch.nn.Module:
        q, kv = cls.model_heads
        return tiny_lora_model(
            0, tie_word_embeddings=tied, num_attention_heads=q, num_key_value_heads=kv
        )

    @classmethod
    def expected_weights(cls, parameters: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return plain_merge(parameters)
