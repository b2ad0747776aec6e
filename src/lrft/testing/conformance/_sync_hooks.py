"""The hooks of ``WeightSyncSuite``: supplied by a backend's subclass, read by the checks."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar, Generic, TypeVar

import pytest
import torch

from lrft.api import RolloutEngine, TrainableModel, TrainBackend, WeightSync
from lrft.api.media import Modality
from lrft.testing.audio_models import tiny_audio_lm
from lrft.testing.distributed import DistributedSuite
from lrft.testing.models import save_tiny_causal_lm, tiny_causal_lm
from lrft.testing.vision_models import tiny_vlm

S = TypeVar("S", bound=WeightSync)


class WeightSyncHooks(DistributedSuite, abc.ABC, Generic[S]):
    """What a subclass of ``WeightSyncSuite`` supplies: how to build the object under test,
    backdoors that read its state without the API under test, and the settings the checks read."""

    @pytest.fixture(scope="class")
    @classmethod
    def model_dir(cls, tmp_path_factory: pytest.TempPathFactory) -> Path:
        """The source model's folder (untied embeddings)."""
        return cls._save_model(tmp_path_factory.mktemp("sync-model"), tied=False)

    @pytest.fixture(scope="class")
    @classmethod
    def tied_model_dir(cls, tmp_path_factory: pytest.TempPathFactory) -> Path:
        """The source model's folder with tied embeddings."""
        return cls._save_model(tmp_path_factory.mktemp("sync-model-tied"), tied=True)

    @classmethod
    def _save_model(cls, directory: Path, *, tied: bool) -> Path:
        q, kv = cls.model_heads
        return save_tiny_causal_lm(
            directory,
            seed=0,
            num_attention_heads=q,
            num_key_value_heads=kv,
            tie_word_embeddings=tied,
        )

    #: the dtype the engine stores; a subclass for a bf16 engine sets ``torch.bfloat16``
    engine_dtype: ClassVar[torch.dtype] = torch.float32
    #: (attention heads, key/value heads) of the tiny trained model (hidden size 64), for engines
    #: whose kernels need other shapes (vLLM's CPU attention needs head_dim >= 32: ``(2, 2)``)
    model_heads: ClassVar[tuple[int, int]] = (4, 2)
    #: the size of the TP groups the engines ``make_engine`` builds span: the ranks of one
    #: group fail together in the one-group failure test
    tp_size: ClassVar[int] = 1
    #: the source model has LoRA adapters (``lrft.testing.lora.LoraSyncModels``): the engine
    #: must hold their plain merge, and the checks of sending changes only run
    lora: ClassVar[bool] = False

    @classmethod
    @abc.abstractmethod
    def make_sync(cls, bucket_bytes: int) -> S:
        """The sync under test, bounded to ``bucket_bytes`` per bucket."""

    @classmethod
    @abc.abstractmethod
    def make_train_backend(cls) -> TrainBackend:
        """The train backend whose trainable model is the sync's source (inside a rank)."""

    @classmethod
    @abc.abstractmethod
    def make_engine(
        cls, model_dir: Path, dtype: torch.dtype, device: torch.device
    ) -> RolloutEngine:
        """An engine serving ``model_dir`` in ``dtype`` on ``device`` (inside a rank): the rank's
        own device, except in the ``cross_device`` test."""

    @classmethod
    @abc.abstractmethod
    def read_engine_weights(cls, engine: RolloutEngine) -> Mapping[str, torch.Tensor]:
        """Backdoor: the engine's weights in Hugging Face names, read without its API."""

    @classmethod
    def make_source_model(cls, *, tied: bool = False) -> torch.nn.Module:
        """The model the source trains (seed 0): the tiny model with ``model_heads``."""
        q, kv = cls.model_heads
        return tiny_causal_lm(
            0, num_attention_heads=q, num_key_value_heads=kv, tie_word_embeddings=tied
        )

    @classmethod
    def make_media_source_model(cls, modality: Modality) -> torch.nn.Module:
        """The vision- or audio-language model a media source trains (seed 0, ``model_heads``):
        the tiny Qwen2-VL for ``images``, the tiny Qwen2-Audio for ``audio``, as the folders
        the media check serves hold (``lrft.testing.vision_models``, ``audio_models``)."""
        q, kv = cls.model_heads
        build = tiny_vlm if modality == "images" else tiny_audio_lm
        return build(0, num_attention_heads=q, num_key_value_heads=kv)

    @classmethod
    def source_parameters(cls, source: TrainableModel) -> Mapping[str, torch.Tensor]:
        """Backdoor: the source's parameters at full shape by ``named_parameters()`` name of the
        model it wraps, without ``full_weights``. Collective. Needed by the LoRA checks only."""
        raise NotImplementedError(f"{cls.__name__} gives no source_parameters backdoor")

    @classmethod
    def expected_weights(cls, parameters: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What the engine must hold for a source whose parameters are ``parameters``: the
        parameters themselves, or for a LoRA source their plain merge."""
        return dict(parameters)
