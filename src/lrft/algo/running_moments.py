"""Mergeable mean/variance statistics (Welford's update, Chan et al.'s merge).

One record holds ``count``, ``mean`` and ``m2`` (the sum of squared deviations from the mean) as
Python numbers in double precision. Two records merge exactly as if their samples had been
pooled, so a trainer gathers one record per rank and folds them with :meth:`merge`: every rank
then holds the statistics of the global batch, without a sum-of-squares all-reduce (which loses
precision when the mean is large against the spread).

Sources: B. P. Welford, "Note on a method for calculating corrected sums of squares and
products", Technometrics 1962; T. F. Chan, G. H. Golub, R. J. LeVeque, "Updating formulae and a
pairwise algorithm for computing sample variances", 1979 (the pairwise merge).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import attrs
import torch
from torch import Tensor

from lrft.algo._tensor import resolution
from lrft.api import validators as c


@attrs.frozen(kw_only=True)
class RunningMoments:
    """Count, mean and sum of squared deviations of a stream of numbers; immutable.

    Checkpoint it with ``attrs.asdict`` (three numbers) and restore with ``RunningMoments(**d)``.
    """

    count: int = attrs.field(default=0, validator=c.non_negative_int)
    mean: float = attrs.field(default=0.0, converter=float, validator=c.finite)
    m2: float = attrs.field(default=0.0, converter=float, validator=[c.finite, c.non_negative])

    @classmethod
    def from_values(cls, values: Tensor) -> RunningMoments:
        """Statistics of every element of ``values`` (select valid entries before calling)."""
        flat = values.detach().reshape(-1).to(torch.float64)
        count = int(flat.numel())
        if count == 0:
            return cls()
        # The exact mean lies in [min, max]: clamping a rounded one back keeps a set of equal
        # values at exactly their value, with m2 == 0, whatever their dtype.
        mean = flat.mean().clamp(min=flat.min(), max=flat.max())
        m2 = ((flat - mean) ** 2).sum()
        return cls(count=count, mean=float(mean.item()), m2=float(m2.item()))

    def merge(self, other: RunningMoments) -> RunningMoments:
        """Statistics of the pooled samples (Chan et al. 1979).

        ``n = na + nb``, ``delta = mean_b - mean_a``, ``mean = mean_a + delta * nb / n``,
        ``m2 = m2_a + m2_b + delta^2 * na * nb / n``.
        """
        n = self.count + other.count
        if n == 0:
            return RunningMoments()
        delta = other.mean - self.mean
        mean = self.mean + delta * other.count / n
        m2 = self.m2 + other.m2 + delta * delta * self.count * other.count / n
        return RunningMoments(count=n, mean=mean, m2=m2)

    def update(self, values: Tensor) -> RunningMoments:
        """These statistics merged with those of ``values``."""
        return self.merge(RunningMoments.from_values(values))

    @classmethod
    def merge_all(cls, parts: Iterable[RunningMoments]) -> RunningMoments:
        """Fold :meth:`merge` over ``parts`` in order (the same order on every rank)."""
        total = cls()
        for part in parts:
            total = total.merge(part)
        return total

    @property
    def variance(self) -> float:
        """Population variance ``m2 / n`` (0 when empty)."""
        return self.m2 / self.count if self.count else 0.0

    @property
    def sample_variance(self) -> float:
        """Bessel-corrected variance ``m2 / (n - 1)`` (0 below two samples)."""
        return self.m2 / (self.count - 1) if self.count > 1 else 0.0

    @property
    def sample_std(self) -> float:
        return math.sqrt(self.sample_variance)

    def below_resolution(self, dtype: torch.dtype) -> bool:
        """Whether the values agree to within the rounding resolution of ``dtype``: their
        root-mean-square deviation is at most ``resolution(dtype) * |mean|`` (always true for
        equal values, and for fewer than two). Such values carry no spread to normalise by."""
        return math.sqrt(self.variance) <= resolution(dtype) * abs(self.mean)

    def to_tensor(self, device: torch.device | str | None = None) -> Tensor:
        """``[count, mean, m2]`` in float64, for ``all_gather``; inverse of :meth:`from_tensor`."""
        return torch.tensor(
            [float(self.count), self.mean, self.m2], dtype=torch.float64, device=device
        )

    @classmethod
    def from_tensor(cls, packed: Tensor) -> RunningMoments:
        if packed.shape != (3,):
            raise ValueError(f"expected a (3,) tensor [count, mean, m2], got {tuple(packed.shape)}")
        count, mean, m2 = (float(x) for x in packed.detach().to("cpu", torch.float64).tolist())
        return cls(count=round(count), mean=mean, m2=m2)

    def normalize(self, values: Tensor, *, subtract_mean: bool = True, eps: float = 1e-8) -> Tensor:
        """``(values - mean) / (std + eps)`` (``values / (std + eps)`` without centring).

        ``std`` is the Bessel-corrected standard deviation. Used for running reward
        normalisation: rewards are scaled by statistics of every reward seen so far. When the
        statistics are :meth:`below_resolution` for ``values``' dtype there is no spread to
        scale by: centred values are exactly 0 and uncentred ones are returned unscaled, where
        dividing by ``eps`` alone would multiply them (and their rounding noise) by ``1 / eps``.
        """
        if self.count == 0:
            raise ValueError("cannot normalise with empty statistics (count == 0); update first")
        if self.below_resolution(values.dtype):
            return torch.zeros_like(values) if subtract_mean else values.clone()
        centred = values - self.mean if subtract_mean else values
        return centred / (self.sample_std + eps)
