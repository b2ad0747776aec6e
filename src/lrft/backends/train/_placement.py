"""What the train backends share: at start-up, the process group they need, the device they
compute on and whether they compute in bf16 (:class:`PlacedBackend`); afterwards, the bookkeeping
of where each part of the models they return lives (:class:`OffloadableModel`, and
:class:`TrainableParts` for a model with gradients and optimizer state)."""

from __future__ import annotations

import abc
import os
from collections.abc import Collection, Iterator, Sequence
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import torch
import torch.distributed as dist
from torch.optim.lr_scheduler import LambdaLR

from lrft.api.capabilities import TrainCapabilities
from lrft.api.errors import CapabilityNotSupported, ConfigError, LrftError
from lrft.api.types import Location, ModelPart, Placement

_HOST = torch.device("cpu")


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


class _PrecisionSetting(Protocol):
    @property
    def mixed_precision(self) -> bool | None: ...


ConfigT = TypeVar("ConfigT", bound=_PrecisionSetting)


class PlacedBackend(Generic[ConfigT]):
    """A train backend's start-up and what it decided: the default process group exists, the
    device (:func:`current_device`) and bf16 compute (``config.mixed_precision`` resolved for
    that device). A subclass sets ``_capabilities`` once it knows what it can offload."""

    _capabilities: TrainCapabilities

    def __init__(self, name: str, config: ConfigT) -> None:
        require_process_group(name)
        self._name = name
        self._config = config
        self._device = current_device()
        self._mixed = resolve_mixed_precision(
            config.mixed_precision, self._device, f"{type(config).__name__}.mixed_precision"
        )

    @property
    def name(self) -> str:
        return self._name

    @property
    def capabilities(self) -> TrainCapabilities:
        return self._capabilities

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def config(self) -> ConfigT:
        return self._config


class OffloadableModel(abc.ABC):
    """Where each part of a backend's model lives, and ``offload``/``reload`` over it.

    A subclass names its backend (``_backend``, which ``CapabilityNotSupported`` reports), says
    which parts it has (``_parts``) and how one part moves (``_move_part``). Moving a part that is
    already where it is asked to go does nothing. A ``.grad`` must live on its parameter's device,
    so the gradients of ``_gradient_owners`` are set aside while either of them is off the device
    (moved with the gradients' part) and put back once both are home.
    """

    _backend: ClassVar[str]

    def __init__(
        self,
        *,
        device: torch.device,
        movable: frozenset[ModelPart],
        where: Location = Location.DEVICE,
    ) -> None:
        """``device``: where the parts live when not offloaded; ``movable``: the parts the
        backend declares it can offload; ``where``: every part's location at the start."""
        self._device = device
        self._movable = movable & self._parts()
        self._locations = dict.fromkeys(ModelPart, where)
        self._set_aside: dict[torch.nn.Parameter, torch.Tensor] = {}

    def _parts(self) -> frozenset[ModelPart]:
        """The parts this model has: a frozen model has only parameters."""
        return frozenset({ModelPart.PARAMETERS})

    def _gradient_owners(self) -> Sequence[torch.nn.Parameter]:
        """The parameters whose gradients offloading sets aside (a frozen model has none)."""
        return ()

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
                self._move(part, to_host=True)
                self._locations[part] = Location.HOST

    def reload(self, parts: Collection[ModelPart]) -> None:
        for part in self._checked(parts):
            if self._locations[part] is Location.HOST:
                self._move(part, to_host=False)
                self._locations[part] = Location.DEVICE
        home = (ModelPart.PARAMETERS, ModelPart.GRADIENTS)
        if all(self._locations[part] is Location.DEVICE for part in home):
            self._restore_gradients()

    def _move(self, part: ModelPart, *, to_host: bool) -> None:
        self._move_part(part, to_host=to_host)
        if part is ModelPart.GRADIENTS:
            target = _HOST if to_host else self._device
            for param, grad in self._set_aside.items():
                self._set_aside[param] = grad.to(target)

    def _set_aside_gradients(self) -> None:
        # A move of the parameters (module.to) would otherwise carry .grad along with them.
        for param in self._gradient_owners():
            if param.grad is not None:
                self._set_aside[param] = param.grad
                param.grad = None

    def _restore_gradients(self) -> None:
        for param, grad in self._set_aside.items():
            param.grad = grad
        self._set_aside.clear()

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
        """Move ``part`` to the host or back to the device (the backend's own moves; the
        gradients set aside are moved after it)."""

    def _require_on_device(self, parts: Collection[ModelPart], action: str) -> None:
        away = [part.value for part in parts if self._locations[part] is Location.HOST]
        if away:
            raise LrftError(f"{action} needs {', '.join(away)} on the device: reload them first")


class TrainableParts(OffloadableModel):
    """What a trainable model adds to its backend's frozen one: every part, gradients set aside
    from the parameters it trains (``_params``), its LR schedule and its optimizer-step count.
    Listed first among the bases (``class X(TrainableParts, XFrozenModel)``), it adds no
    ``__init__``: the subclass sets the three attributes."""

    _params: list[torch.nn.Parameter]
    _scheduler: LambdaLR
    _steps: int

    def _parts(self) -> frozenset[ModelPart]:
        return frozenset(ModelPart)

    def _gradient_owners(self) -> Sequence[torch.nn.Parameter]:
        return self._params

    @property
    def scheduler(self) -> LambdaLR:
        return self._scheduler

    @property
    def optimizer_steps(self) -> int:
        return self._steps


def optimizer_moments(
    optimizer: torch.optim.Optimizer,
) -> Iterator[tuple[dict[str, Any], str, torch.Tensor]]:
    """``(state, key, tensor)`` of every tensor of the optimizer's state that moves with the
    optimizer part. AdamW's ``step`` counter stays where AdamW keeps it (the host, or the device
    when fused or capturable): it is not part of the moved state."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step":
                yield state, key, value
