"""The library warnings lrft filters at its call sites: each only there, only by its message."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from lrft.backends.train.lora import LoraSettings, apply_lora
from lrft.demos.model import load_model
from lrft.trainer.build import enable_activation_checkpointing
from lrft.trainer.sequences import fsdp2_view_outputs_safe


class _ReturnsAView(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear(x)
        return out[..., :3]  # a view, as a head's sliced output is


@pytest.fixture
def one_rank_group(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def _forward(module: torch.nn.Module, *, quiet: bool) -> list[str]:
    """The warnings a forward and backward give, every one recorded (lrft's filter inside)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with fsdp2_view_outputs_safe() if quiet else contextlib.nullcontext():
            module(torch.ones(2, 4)).sum().backward()
            warnings.warn("something else", UserWarning, stacklevel=1)
    return [str(w.message) for w in caught]


def test_fsdp2s_view_warning_is_silenced_inside_lrfts_forwards_only(
    one_rank_group: None,
) -> None:
    module = _ReturnsAView()
    fully_shard(module)
    shown = _forward(module, quiet=False)
    assert any("returned a view tensor" in message for message in shown)  # torch warns
    assert _forward(module, quiet=True) == ["something else"]  # that one only is filtered
    assert any("returned a view tensor" in message for message in _forward(module, quiet=False))


def _warnings_of(action: Callable[[], object]) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        action()
    return [f"{w.category.__name__}: {w.message}" for w in caught]


def _checkpointing(model: torch.nn.Module) -> bool:
    return any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


def test_activation_checkpointing_is_enabled_by_its_current_name() -> None:
    model = load_model()
    assert not _checkpointing(model)
    assert _warnings_of(lambda: enable_activation_checkpointing(model)) == []
    assert _checkpointing(model)

    class Older(torch.nn.Module):  # a transformers release before the rename
        enabled = False

        def gradient_checkpointing_enable(self) -> None:
            self.enabled = True

    older = Older()
    enable_activation_checkpointing(older)
    assert older.enabled


def test_lora_on_a_checkpointed_model_gives_no_deprecation_warning() -> None:
    pytest.importorskip("peft", reason="LoRA needs peft (pip install 'lrft[lora]')")
    model = load_model()
    enable_activation_checkpointing(model)
    settings = LoraSettings(rank=4, alpha=8, target_modules=("q_proj", "v_proj"))
    wrapped: list[torch.nn.Module] = []
    assert _warnings_of(lambda: wrapped.append(apply_lora(model, settings))) == []
    assert any("lora_A" in name for name, _ in wrapped[0].named_parameters())
