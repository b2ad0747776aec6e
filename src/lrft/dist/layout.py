"""Rollout topology as pure data; only ``build_groups`` touches ``torch.distributed``."""

from __future__ import annotations

from functools import cached_property

import attrs
import torch.distributed as dist

from lrft.api import validators as v
from lrft.api.errors import ConfigError


@attrs.frozen(kw_only=True)
class RolloutLayout:
    """How ``world_size`` ranks form tensor-parallel (TP) rollout groups.

    TP group ``i`` holds the consecutive ranks ``[i*tp, ..., i*tp + tp - 1]`` (one engine spans
    them; consecutive ranks share a node, where TP traffic is cheapest). DP group ``j`` holds the
    strided ranks ``range(j, world_size, tp)``: one rank of each TP group, the ranks that hold the
    same TP shard.
    """

    world_size: int = attrs.field(validator=v.positive_int)
    tp_size: int = attrs.field(validator=v.positive_int)

    def __attrs_post_init__(self) -> None:
        if self.world_size % self.tp_size:
            raise ConfigError(
                f"world_size {self.world_size} is not divisible by tp_size {self.tp_size} "
                f"(world_size % tp_size = {self.world_size % self.tp_size}, must be 0)"
            )

    @property
    def dp_size(self) -> int:
        return self.world_size // self.tp_size

    @cached_property
    def tp_groups(self) -> tuple[tuple[int, ...], ...]:
        tp = self.tp_size
        return tuple(tuple(range(i * tp, (i + 1) * tp)) for i in range(self.dp_size))

    @cached_property
    def dp_groups(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(range(j, self.world_size, self.tp_size)) for j in range(self.tp_size))

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ConfigError(f"rank {rank} is outside [0, world_size={self.world_size})")

    def tp_group_of(self, rank: int) -> tuple[int, ...]:
        self._check_rank(rank)
        return self.tp_groups[rank // self.tp_size]

    def dp_group_of(self, rank: int) -> tuple[int, ...]:
        self._check_rank(rank)
        return self.dp_groups[rank % self.tp_size]

    def tp_rank(self, rank: int) -> int:
        """The rank's index inside its TP group (which shard of the engine it holds)."""
        self._check_rank(rank)
        return rank % self.tp_size

    def build_groups(self) -> RolloutGroups:
        """Create this rank's TP and DP process groups. Collective over the default group.

        Every rank creates every group (``new_group`` is collective over the whole world even
        for groups it is not a member of) and keeps the two that contain it.
        """
        if not dist.is_initialized():
            raise RuntimeError("build_groups needs torch.distributed to be initialised first")
        if dist.get_world_size() != self.world_size:
            raise ConfigError(
                f"RolloutLayout world_size {self.world_size} does not match the process group's "
                f"world size {dist.get_world_size()}"
            )
        rank = dist.get_rank()
        tp_group = dp_group = None
        for ranks in self.tp_groups:
            group = dist.new_group(list(ranks))
            if rank in ranks:
                tp_group = group
        for ranks in self.dp_groups:
            group = dist.new_group(list(ranks))
            if rank in ranks:
                dp_group = group
        assert tp_group is not None and dp_group is not None
        return RolloutGroups(
            layout=self, rank=rank, tp_group=tp_group, dp_group=dp_group
        )


@attrs.frozen(kw_only=True)
class RolloutGroups:
    """This rank's process groups of a ``RolloutLayout`` (runtime objects, never config)."""

    layout: RolloutLayout
    rank: int
    tp_group: dist.ProcessGroup
    dp_group: dist.ProcessGroup

    @property
    def tp_ranks(self) -> tuple[int, ...]:
        return self.layout.tp_group_of(self.rank)

    @property
    def dp_ranks(self) -> tuple[int, ...]:
        return self.layout.dp_group_of(self.rank)
