"""The hooks of ``TrainBackendSuite``: supplied by a backend's subclass, read by the checks."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import ClassVar, Generic, TypeVar

import torch

from lrft.api.protocols import FrozenModel, TrainableModel, TrainBackend
from lrft.testing.distributed import DistributedSuite
from lrft.testing.models import tiny_causal_lm

B = TypeVar("B", bound=TrainBackend)


class TrainBackendHooks(DistributedSuite, Generic[B], abc.ABC):
    """What a subclass of ``TrainBackendSuite`` supplies: how to build the object under test,
    backdoors that read its state without the API under test, and the settings the checks read."""

    #: the world size a checkpoint saved at ``world_size`` is loaded at, for backends that
    #: declare ``checkpoint_resharding`` (None: 1, or 2 when ``world_size`` is 1)
    resharding_world_size: ClassVar[int | None] = None
    #: the model has LoRA adapters (``lrft.testing.lora.LoraTrainModels``): the checks of a
    #: model that trains its adapters only run
    lora: ClassVar[bool] = False

    # --- what a subclass supplies --------------------------------------------------------------

    @classmethod
    @abc.abstractmethod
    def make_backend(cls) -> B:
        """Build the backend on the current rank (the default process group exists), in fp32."""

    @classmethod
    @abc.abstractmethod
    def parameter_shards(cls, model: FrozenModel) -> dict[str, torch.Tensor]:
        """Backdoor: this rank's own piece of every parameter (its shard, or the whole tensor
        where the backend replicates it), the live tensors wherever they are now, keyed by any
        stable name. Must not go through ``full_weights``, ``offload`` or ``reload``."""

    @classmethod
    @abc.abstractmethod
    def optimizer_state(cls, model: TrainableModel) -> dict[str, torch.Tensor]:
        """Backdoor: this rank's optimizer state tensors that scale with the parameters (AdamW's
        first and second moments; not scalar step counters), live, keyed by any stable name."""

    @classmethod
    @abc.abstractmethod
    def gathered_parameters(cls, model: FrozenModel) -> dict[str, torch.Tensor]:
        """Backdoor: every parameter at full shape in Hugging Face names (e.g. ``full_tensor()``
        of the module's DTensor parameters), without ``full_weights``. Collective."""

    @classmethod
    def make_model(cls, seed: int, *, tie_word_embeddings: bool = False) -> torch.nn.Module:
        """The model trained by the backend and, separately built, by the reference."""
        return tiny_causal_lm(seed, tie_word_embeddings=tie_word_embeddings)

    @classmethod
    def full_weights_of(cls, parameters: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What ``full_weights`` must yield for a model whose full-shape parameters are
        ``parameters`` (by ``named_parameters()`` name): the parameters themselves, or for a
        LoRA model their plain merge."""
        return dict(parameters)

    @classmethod
    def model_for_load(cls, saved_seed: int, fresh_seed: int) -> torch.nn.Module:
        """A model that only ``load`` of a checkpoint of ``make_model(saved_seed)`` makes equal
        to it: another seed's model, or, where checkpoints hold the trainable parameters only
        (LoRA adapters), the same frozen weights with other trainable ones."""
        return cls.make_model(fresh_seed)
