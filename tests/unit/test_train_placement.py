"""The train backends' shared rules: precision by device, a process group first, and gradients
set aside while they or their parameters are off the device."""

from __future__ import annotations

import pytest
import torch

from lrft.api import CapabilityNotSupported, ConfigError, Location, ModelPart
from lrft.backends.train._placement import (
    TrainableParts,
    require_process_group,
    resolve_mixed_precision,
)

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


@pytest.mark.parametrize(
    ("requested", "device", "expected"),
    [(None, CPU, False), (None, CUDA, True), (False, CUDA, False), (True, CUDA, True)],
)
def test_mixed_precision_follows_the_device_unless_asked(
    requested: bool | None, device: torch.device, expected: bool
) -> None:
    assert resolve_mixed_precision(requested, device, "X.mixed_precision") is expected


def test_bf16_on_the_cpu_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"X\.mixed_precision=True needs CUDA"):
        resolve_mixed_precision(True, CPU, "X.mixed_precision")


def test_backends_need_a_process_group() -> None:
    with pytest.raises(RuntimeError, match=r"the fsdp2 backend needs torch\.distributed"):
        require_process_group("fsdp2")


class _Toy(TrainableParts):
    """A trainable model whose moves are only recorded (one parameter, on the CPU)."""

    _backend = "toy"

    def __init__(self) -> None:
        super().__init__(device=CPU, movable=frozenset(ModelPart))
        self.weight = torch.nn.Parameter(torch.ones(3))
        self._params = [self.weight]
        self._steps = 0
        self.moves: list[tuple[ModelPart, bool, bool]] = []

    def _move_part(self, part: ModelPart, *, to_host: bool) -> None:
        # what the backend's own move sees: is the gradient still on its parameter?
        self.moves.append((part, to_host, self.grad() is not None))

    def grad(self) -> torch.Tensor | None:
        return self.weight.grad


def test_gradients_are_set_aside_while_their_parameters_or_they_are_away() -> None:
    model = _Toy()
    grad = torch.full((3,), 2.0)
    model.weight.grad = grad
    model.offload([ModelPart.PARAMETERS])
    assert model.grad() is None  # a .grad must live on its parameter's device
    assert model.moves == [(ModelPart.PARAMETERS, True, False)]
    model.offload([ModelPart.GRADIENTS])
    model.reload([ModelPart.PARAMETERS])
    assert model.grad() is None  # the gradients are still away
    model.reload([ModelPart.GRADIENTS])
    assert model.grad() is grad
    assert model.placement.gradients is Location.DEVICE
    # a part already where it is asked to go does not move again
    model.reload([ModelPart.GRADIENTS])
    assert len(model.moves) == 4


def test_a_frozen_model_refuses_parts_it_lacks_by_name() -> None:
    class Frozen(_Toy):
        def _parts(self) -> frozenset[ModelPart]:
            return frozenset({ModelPart.PARAMETERS})

    with pytest.raises(CapabilityNotSupported, match="offload_optimizer"):
        Frozen().offload([ModelPart.OPTIMIZER])
