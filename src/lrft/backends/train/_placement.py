"""What the train backends share: at start-up, the process group they need, the device they
compute on and whether they compute in bf16; afterwards, the bookkeeping of where each part of the
models they return lives."""

from __future__ import annotations

import abc
import os
from collections.abc import Collection
from typing import ClassVar

import torch
import torch.distributed as dist

from lrft.api.errors import CapabilityNotSupported, ConfigError, LrftError
from lrft.api.types import Location, ModelPart, Placement


def require_process_group(backend: str) -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            f"the {backend} backend needs torch.distributed to be initialised: call "
            "lrft.dist.init_distributed() first (a single process uses a 1-rank group)"
        )


def current_device() -> torch.device:
    """``cuda:LOCAL_RANK`` (or the current CUDA device) where CUDA exists, else the CPU; the
    CUDA device is made current."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    local_rank = os.environ.get("LOCAL_RANK")
    index = int(local_rank) if local_rank is not None else torch.cuda.current_device()
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    return device


def resolve_mixed_precision(requested: bool | None, device: torch.device, setting: str) -> bool:
    """``None`` means bf16 where CUDA is available; ``True`` without CUDA is a ConfigError naming
    ``setting`` (gloo on CPU computes in fp32)."""
    on_cuda = device.type == "cuda"
    if requested and not on_cuda:
        raise ConfigError(
            f"{setting}=True needs CUDA (bf16 compute); use None to enable it only where CUDA "
            "is available"
        )
    return on_cuda if requested is None else requested


class OffloadableModel(abc.ABC):
    """Where each part of a backend's model lives, and ``offload``/``reload`` over it.

    A subclass names its backend (``_backend``, which ``CapabilityNotSupported`` reports), says
    which parts it has (``_parts``) and how one part moves (``_move_part``). Moving a part that is
    already where it is asked to go does nothing. A ``.grad`` must live on its parameter's device,
    so gradients are set aside while either of them is off the device (``_set_aside_gradients``)
    and put back once both are home (``_restore_gradients``).
    """

    _backend: ClassVar[str]

    def __init__(self, *, movable: frozenset[ModelPart], where: Location = Location.DEVICE) -> None:
        """``movable``: the parts the backend declares it can offload; ``where``: every part's
        location at the start."""
        self._movable = movable & self._parts()
        self._locations = dict.fromkeys(ModelPart, where)

    def _parts(self) -> frozenset[ModelPart]:
        """The parts this model has: a frozen model has only parameters."""
        return frozenset({ModelPart.PARAMETERS})

    @property
    def placement(self) -> Placement:
        """A part the model lacks (a frozen model's gradients and optimizer state) is reported
        where its parameters are."""

        def where(part: ModelPart) -> Location:
            return self._locations[part if part in self._parts() else ModelPart.PARAMETERS]

        return Placement(
            parameters=where(ModelPart.PARAMETERS),
            gradients=where(ModelPart.GRADIENTS),
            optimizer=where(ModelPart.OPTIMIZER),
        )

    def offload(self, parts: Collection[ModelPart]) -> None:
        checked = self._checked(parts)
        if ModelPart.PARAMETERS in checked or ModelPart.GRADIENTS in checked:
            self._set_aside_gradients()
        for part in checked:
            if self._locations[part] is Location.DEVICE:
                self._move_part(part, to_host=True)
                self._locations[part] = Location.HOST

    def reload(self, parts: Collection[ModelPart]) -> None:
        for part in self._checked(parts):
            if self._locations[part] is Location.HOST:
                self._move_part(part, to_host=False)
                self._locations[part] = Location.DEVICE
        home = (ModelPart.PARAMETERS, ModelPart.GRADIENTS)
        if all(self._locations[part] is Location.DEVICE for part in home):
            self._restore_gradients()

    def _set_aside_gradients(self) -> None:  # noqa: B027  # a no-op unless a subclass holds gradients
        """Hook: detach the gradients from their parameters (a frozen model has none)."""

    def _restore_gradients(self) -> None:  # noqa: B027  # a no-op unless a subclass holds gradients
        """Hook: give the gradients set aside back to their parameters."""

    def _checked(self, parts: Collection[ModelPart]) -> list[ModelPart]:
        parts = [ModelPart(part) for part in parts]
        for part in parts:
            if part not in self._movable:
                raise CapabilityNotSupported(
                    self._backend,
                    f"offload_{part.value}",
                    f"{type(self).__name__} cannot move {part.value}",
                )
        return parts

    @abc.abstractmethod
    def _move_part(self, part: ModelPart, *, to_host: bool) -> None:
        """Move ``part`` to the host or back to the device (the backend's own moves)."""

    def _require_on_device(self, parts: Collection[ModelPart], action: str) -> None:
        away = [part.value for part in parts if self._locations[part] is Location.HOST]
        if away:
            raise LrftError(f"{action} needs {', '.join(away)} on the device: reload them first")
