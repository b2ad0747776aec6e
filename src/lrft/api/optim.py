"""Optimizer and learning-rate schedule settings a ``TrainBackend`` builds from.

Backends build the optimizer themselves (each shards its state its own way); these records make
every backend build the same one: AdamW with the given hyper-parameters, gradient-norm clipping,
and a warm-up followed by a constant, linear or cosine schedule.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

import attrs

from lrft.api import validators as v


def _float_tuple(value: Iterable[float]) -> tuple[float, ...]:
    # A typed converter: with ``converter=tuple`` mypy's attrs plugin types the argument as an
    # unsolved ``Iterable[_T_co]`` and rejects every call that passes ``betas``.
    return tuple(value)


def _betas(
    _: object, attribute: attrs.Attribute[tuple[float, float]], value: tuple[float, float]
) -> None:
    if len(value) != 2 or not all(0.0 <= b < 1.0 for b in value):
        raise ValueError(f"{attribute.name} must be two numbers in [0, 1), got {value!r}")


@attrs.frozen(kw_only=True)
class OptimizerConfig:
    """AdamW settings and gradient clipping. ``max_grad_norm <= 0`` disables clipping."""

    lr: float = attrs.field(default=1e-6, validator=[v.finite, v.positive_number])
    betas: tuple[float, float] = attrs.field(
        default=(0.9, 0.999), converter=_float_tuple, validator=_betas
    )
    eps: float = attrs.field(default=1e-8, validator=v.positive_number)
    weight_decay: float = attrs.field(default=0.0, validator=[v.finite, v.non_negative])
    max_grad_norm: float = attrs.field(default=1.0, validator=v.finite)


ScheduleKind = Literal["constant", "linear", "cosine"]


@attrs.frozen(kw_only=True)
class SchedulerConfig:
    """Learning-rate multiplier over optimizer steps.

    Linear warm-up from ``1 / (warmup_steps + 1)`` to 1 over ``warmup_steps`` steps, then
    ``kind``: constant; linear decay to ``min_lr_ratio`` at ``total_steps``; or cosine decay to
    ``min_lr_ratio`` at ``total_steps``.
    """

    kind: ScheduleKind = attrs.field(
        default="constant", validator=attrs.validators.in_(("constant", "linear", "cosine"))
    )
    warmup_steps: int = attrs.field(default=0, validator=v.non_negative)
    total_steps: int | None = None
    min_lr_ratio: float = attrs.field(default=0.0, validator=[v.finite, v.non_negative])

    def __attrs_post_init__(self) -> None:
        if self.kind != "constant" and (
            self.total_steps is None or self.total_steps <= self.warmup_steps
        ):
            raise ValueError(
                f"a {self.kind} schedule needs total_steps > warmup_steps, got "
                f"total_steps={self.total_steps}, warmup_steps={self.warmup_steps}"
            )
        if self.min_lr_ratio > 1.0:
            raise ValueError(f"min_lr_ratio must be <= 1, got {self.min_lr_ratio}")

    def multiplier(self, step: int) -> float:
        """The learning-rate multiplier for the ``step``-th optimizer step (counted from 0)."""
        if step < self.warmup_steps:
            return (step + 1) / (self.warmup_steps + 1)
        if self.kind == "constant":
            return 1.0
        assert self.total_steps is not None  # checked at construction
        progress = min(1.0, (step - self.warmup_steps) / (self.total_steps - self.warmup_steps))
        if self.kind == "linear":
            decay = 1.0 - progress
        else:
            decay = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * decay
