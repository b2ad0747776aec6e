"""Mask and shape helpers shared by every module of :mod:`lrft.algo`.

Padding may hold anything (stale logits, NaN from an engine, uninitialised memory). Each public
function therefore replaces masked entries with a neutral value *before* any arithmetic, with
``torch.where`` rather than a product: ``nan * 0`` is ``nan``, and a product would also let NaN
reach the gradient of the padded entries.

Centring (subtracting a group's or a batch's mean) follows one rule, :func:`below_resolution`:
values that agree to within the rounding resolution of their dtype are taken to be equal, and
their centred values are exactly 0. Dividing such rounding noise by a standard deviation of the
same size would turn a batch that carries no signal into advantages of order one.
"""

from __future__ import annotations

import torch
from torch import Tensor

RESOLUTION_ULPS = 4.0
"""How many machine epsilons of spread, relative to the values' mean, count as rounding."""


def resolution(dtype: torch.dtype) -> float:
    """The smallest relative spread of values of ``dtype`` that counts as a difference:
    ``RESOLUTION_ULPS * finfo(dtype).eps`` (about 4.8e-7 for float32, 8.9e-16 for float64)."""
    return RESOLUTION_ULPS * torch.finfo(dtype).eps


def below_resolution(spread: Tensor, mean: Tensor, dtype: torch.dtype) -> Tensor:
    """Whether values of ``dtype`` whose root-mean-square deviation from their ``mean`` is
    ``spread`` agree to within rounding: ``spread <= resolution(dtype) * |mean|``.

    A set of equal values (``spread == 0``) always does, whatever its mean.
    """
    return spread <= resolution(dtype) * mean.abs()


def as_mask(mask: Tensor) -> Tensor:
    """``mask`` as a bool tensor; any non-zero entry counts as valid."""
    return mask if mask.dtype == torch.bool else mask != 0


def check_2d(name: str, tensor: Tensor) -> None:
    if tensor.dim() != 2:
        raise ValueError(f"{name} must be 2-D (batch, time), got shape {tuple(tensor.shape)}")


def check_same_shape(reference_name: str, reference: Tensor, **others: Tensor | None) -> None:
    """Raise ``ValueError`` naming both tensors when a shape differs from ``reference``'s."""
    for name, tensor in others.items():
        if tensor is not None and tensor.shape != reference.shape:
            raise ValueError(
                f"{name} has shape {tuple(tensor.shape)} but {reference_name} has shape "
                f"{tuple(reference.shape)}; they must match"
            )


def check_finite_float(name: str, tensor: Tensor) -> None:
    if not tensor.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {tensor.dtype}")


def fill_masked(values: Tensor, mask: Tensor, fill: float = 0.0) -> Tensor:
    """``values`` where ``mask`` is true and ``fill`` elsewhere (no gradient reaches the fill)."""
    return torch.where(mask, values, torch.full_like(values, fill))


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    filled = fill_masked(values, mask)
    return filled.sum() if dim is None else filled.sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean over the valid entries; 0 where there is none (never NaN)."""
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1).to(values.dtype)


def sequence_mean(per_token: Tensor, mask: Tensor) -> Tensor:
    """Per-row mean over the valid tokens of a (B, T) tensor: shape (B,), 0 for an empty row."""
    return masked_mean(per_token, mask, dim=-1)


def nonempty_rows(mask: Tensor) -> Tensor:
    """(B,) bool: rows with at least one valid token."""
    return mask.any(dim=-1)


def mean_over_rows(per_row: Tensor, rows: Tensor) -> Tensor:
    """Mean of ``per_row`` over the selected rows; 0 when none is selected."""
    return masked_mean(per_row, rows)
