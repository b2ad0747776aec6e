"""The train backends' shared start-up rules: precision by device, a process group first."""

from __future__ import annotations

import pytest
import torch

from lrft.api import ConfigError
from lrft.backends.train._placement import require_process_group, resolve_mixed_precision

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
