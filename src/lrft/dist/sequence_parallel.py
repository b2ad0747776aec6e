"""Ulysses sequence parallelism: which ranks split a sequence, and the collectives that do it.

A sequence-parallel (SP) group of ``sp_size`` consecutive ranks trains one data-parallel share:
its ranks hold the same packed rows, each runs the model on its own contiguous ``1/sp_size`` of
the row's tokens, and around attention :func:`sequence_to_heads` exchanges tokens for heads
(each rank then attends over the whole row with ``1/sp_size`` of the heads) and
:func:`heads_to_sequence` exchanges them back. :func:`combine_shards` adds up per-token results
that each rank computed for its own tokens only.

Gradients: every rank of a group computes the same loss from the combined results, and the train
backends average gradients over every rank of the default group (``sp_size`` ranks per data
share). The backward of :func:`combine_shards` therefore scales the gradient by ``sp_size``: the
ranks' parameter gradients, each from its own tokens, then average to the share's whole gradient
divided by the number of data-parallel shares, as without sequence parallelism.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import attrs
import torch
import torch.distributed as dist
from torch import Tensor

from lrft.api.errors import ConfigError


def _positive(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise ConfigError(f"{attribute.name} must be >= 1, got {value}")


@attrs.frozen(kw_only=True)
class SequenceParallelLayout:
    """How ``world_size`` ranks form sequence-parallel groups of ``sp_size`` consecutive ranks
    (consecutive ranks share a node, where the all-to-all traffic is cheapest). Pure data: only
    :meth:`build_group` creates process groups."""

    world_size: int = attrs.field(validator=_positive)
    sp_size: int = attrs.field(validator=_positive)

    def __attrs_post_init__(self) -> None:
        if self.world_size % self.sp_size:
            raise ConfigError(
                f"world size {self.world_size} is not divisible by sequence_parallel_size "
                f"{self.sp_size} (world_size % sequence_parallel_size = "
                f"{self.world_size % self.sp_size}, must be 0)"
            )

    @property
    def dp_size(self) -> int:
        """The number of data-parallel shares (one per SP group)."""
        return self.world_size // self.sp_size

    @cached_property
    def groups(self) -> tuple[tuple[int, ...], ...]:
        sp = self.sp_size
        return tuple(tuple(range(i * sp, (i + 1) * sp)) for i in range(self.dp_size))

    def group_of(self, rank: int) -> tuple[int, ...]:
        if not 0 <= rank < self.world_size:
            raise ConfigError(f"rank {rank} is outside [0, world_size={self.world_size})")
        return self.groups[rank // self.sp_size]

    def build_group(self) -> dist.ProcessGroup | None:
        """This rank's SP group (``None`` at ``sp_size`` 1). Collective over the default group:
        every rank creates every group, as ``new_group`` requires."""
        if self.sp_size == 1:
            return None
        if not dist.is_initialized() or dist.get_world_size() != self.world_size:
            raise RuntimeError(
                f"build_group needs a default process group of {self.world_size} ranks"
            )
        rank = dist.get_rank()
        mine = None
        for ranks in self.groups:
            group = dist.new_group(list(ranks))
            if rank in ranks:
                mine = group
        return mine


def _exchange(x: Tensor, group: dist.ProcessGroup, scatter_dim: int, gather_dim: int) -> Tensor:
    """Split ``x`` along ``scatter_dim`` into one chunk per rank, send chunk ``j`` to rank ``j``,
    and concatenate what each rank sent along ``gather_dim``, in rank order."""
    size = dist.get_world_size(group)
    chunks = torch.stack(torch.chunk(x, size, dim=scatter_dim)).contiguous()
    received = torch.empty_like(chunks)
    dist.all_to_all_single(received, chunks, group=group)
    return torch.cat(received.unbind(0), dim=gather_dim)


class _Exchange(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: Tensor, group: dist.ProcessGroup, scatter_dim: int, gather_dim: int
    ) -> Tensor:
        ctx.group, ctx.scatter_dim, ctx.gather_dim = group, scatter_dim, gather_dim
        return _exchange(x, group, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        return _exchange(grad, ctx.group, ctx.gather_dim, ctx.scatter_dim), None, None, None


def sequence_to_heads(x: Tensor, group: dist.ProcessGroup) -> Tensor:
    """(batch, heads, tokens / sp, dim) on each rank to (batch, heads / sp, tokens, dim): rank
    ``r`` gets heads ``r * heads / sp`` onwards of every rank's tokens. Differentiable."""
    out: Tensor = _Exchange.apply(x, group, 1, 2)  # type: ignore[no-untyped-call]  # unannotated in torch
    return out


def heads_to_sequence(x: Tensor, group: dist.ProcessGroup) -> Tensor:
    """The inverse of :func:`sequence_to_heads`. Differentiable."""
    out: Tensor = _Exchange.apply(x, group, 2, 1)  # type: ignore[no-untyped-call]  # unannotated in torch
    return out


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, group: dist.ProcessGroup) -> Tensor:
        ctx.size = dist.get_world_size(group)
        total = x.detach().clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        # see the module doc: every rank back-propagates the same loss, and the backends
        # average gradients over all ranks
        return grad * ctx.size, None


def combine_shards(x: Tensor, group: dist.ProcessGroup | None) -> Tensor:
    """The sum over ``group`` of ``x``, where each rank holds its own tokens' values and zeros
    elsewhere; ``x`` itself without a group. Differentiable (see the module doc on gradients).
    Collective over ``group``."""
    if group is None:
        return x
    out: Tensor = _Combine.apply(x, group)  # type: ignore[no-untyped-call]  # unannotated in torch
    return out
