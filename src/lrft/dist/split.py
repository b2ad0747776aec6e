"""The split placement as pure data; only :meth:`SplitLayout.build_groups` (and the start-up
around it, :func:`init_split_distributed`) touches ``torch.distributed``.

Colocated (the default) puts a training shard and an engine on every rank. Split gives the two
jobs ranks of their own: the first ``world_size - rollout_world_size`` ranks train (their own
FSDP2 or ZeRO group, no engine), the last ``rollout_world_size`` ranks roll out (engines in TP
groups of ``tp_size`` consecutive ranks, no optimizer state). Weights travel from the trainer's
sending rank (rank 0) to every rollout rank over the *span* group, samples back over a second
span group of the same members::

    rank      0        1     ...   T-1  |   T      T+1   ...  W-1
    role    train    train   ...  train | rollout rollout ... rollout
            \\------ train group -------/ \\--- TP groups of tp_size ---/
    span    sender                      |   every rollout rank

In each process the role's group is the default process group, so everything that trains (or
generates) runs as it does colocated, over its own ranks only.
"""

from __future__ import annotations

import time
from datetime import timedelta
from functools import cached_property
from typing import Literal

import attrs
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, Store
from torch.distributed.rendezvous import rendezvous

from lrft.api.errors import CollectiveTimeout, ConfigError
from lrft.dist.layout import RolloutLayout
from lrft.dist.span import SpanGroup

Role = Literal["train", "rollout"]
SENDER = 0
"""The trainer rank that sends weights and receives samples: the trainer's rank 0."""
_PREFIX = "lrft/split"


def _positive(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{attribute.name} must be a positive integer, got {value!r}")


@attrs.frozen(kw_only=True)
class SplitLayout:
    """Which of ``world_size`` ranks train and which roll out, in TP groups of ``tp_size``."""

    world_size: int = attrs.field(validator=_positive)
    rollout_world_size: int = attrs.field(validator=_positive)
    tp_size: int = attrs.field(default=1, validator=_positive)

    def __attrs_post_init__(self) -> None:
        world, rollout, tp = self.world_size, self.rollout_world_size, self.tp_size
        if rollout >= world:
            raise ConfigError(
                f"rollout_world_size {rollout} leaves no rank to train: world_size {world} - "
                f"rollout_world_size {rollout} = {world - rollout} trainer ranks, must be >= 1"
            )
        if rollout % tp:
            raise ConfigError(
                f"rollout_world_size {rollout} is not divisible by tp_size {tp} "
                f"(rollout_world_size % tp_size = {rollout % tp}, must be 0): the rollout ranks "
                "form whole TP groups"
            )

    @property
    def train_world_size(self) -> int:
        return self.world_size - self.rollout_world_size

    @cached_property
    def train_ranks(self) -> tuple[int, ...]:
        return tuple(range(self.train_world_size))

    @cached_property
    def rollout_ranks(self) -> tuple[int, ...]:
        return tuple(range(self.train_world_size, self.world_size))

    @cached_property
    def span_ranks(self) -> tuple[int, ...]:
        """The members of the span groups: the sender, then every rollout rank."""
        return (SENDER, *self.rollout_ranks)

    @cached_property
    def rollout_layout(self) -> RolloutLayout:
        """The rollout ranks' TP layout, in their own ranks (rollout rank ``i`` is ``T + i``)."""
        return RolloutLayout(world_size=self.rollout_world_size, tp_size=self.tp_size)

    @cached_property
    def tp_groups(self) -> tuple[tuple[int, ...], ...]:
        """The rollout TP groups in global ranks."""
        offset = self.train_world_size
        return tuple(
            tuple(offset + rank for rank in group) for group in self.rollout_layout.tp_groups
        )

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ConfigError(f"rank {rank} is outside [0, world_size={self.world_size})")

    def role_of(self, rank: int) -> Role:
        self._check_rank(rank)
        return "train" if rank < self.train_world_size else "rollout"

    def role_rank(self, rank: int) -> int:
        """``rank``'s rank in its role's group."""
        return rank if self.role_of(rank) == "train" else rank - self.train_world_size

    def role_world_size(self, rank: int) -> int:
        """The size of ``rank``'s role's group."""
        return self.train_world_size if self.role_of(rank) == "train" else self.rollout_world_size

    def tp_group_of(self, rank: int) -> tuple[int, ...]:
        if self.role_of(rank) != "rollout":
            raise ConfigError(f"rank {rank} trains: it holds no engine and is in no TP group")
        return self.tp_groups[self.role_rank(rank) // self.tp_size]

    def describe(self, rank: int) -> str:
        """``rank``, its role and its place in it, for messages."""
        role = self.role_of(rank)
        if role == "train":
            sender = ", the sender" if rank == SENDER else ""
            return f"rank {rank} (trainer rank {rank} of {self.train_world_size}{sender})"
        return (
            f"rank {rank} (rollout rank {self.role_rank(rank)} of {self.rollout_world_size}, "
            f"TP group {self.tp_group_of(rank)})"
        )

    def build_groups(
        self,
        store: Store,
        *,
        rank: int,
        device: torch.device,
        timeout: timedelta,
    ) -> SplitGroups:
        """This rank's groups, made from ``store`` (the whole job's): its role's group becomes
        the default process group (which must not exist yet), the rollout ranks' TP groups are
        subgroups of theirs, and the sender and the rollout ranks join the two span groups
        (weights on ``device``'s backend, samples on gloo). Collective over the whole job."""
        if dist.is_initialized():
            raise RuntimeError(
                "SplitLayout.build_groups makes each role's group the default process group: "
                "call it before any process group is initialised"
            )
        role = self.role_of(rank)
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            store=PrefixStore(f"{_PREFIX}/{role}/", store),
            rank=self.role_rank(rank),
            world_size=self.role_world_size(rank),
            timeout=timeout,
        )
        tp_group = None
        if role == "rollout" and self.tp_size > 1:
            tp_group = self.rollout_layout.build_groups().tp_group
        weights = exchange = None
        if rank in self.span_ranks:
            weights = SpanGroup.create(
                PrefixStore(f"{_PREFIX}/weights/", store),
                members=self.span_ranks,
                rank=rank,
                device=device,
                timeout=timeout,
            )
            exchange = SpanGroup.create(
                PrefixStore(f"{_PREFIX}/exchange/", store),
                members=self.span_ranks,
                rank=rank,
                device=torch.device("cpu"),
                timeout=timeout,
            )
        return SplitGroups(
            layout=self,
            rank=rank,
            tp_group=tp_group,
            weights=weights,
            exchange=exchange,
            store=store,
        )


@attrs.frozen(kw_only=True, eq=False)
class SplitGroups:
    """This rank's groups of a :class:`SplitLayout` (runtime objects, never config).

    ``tp_group``: a rollout rank's engine TP group (``None`` at TP 1 and on trainer ranks).
    ``weights`` and ``exchange``: the span groups, ``None`` on trainer ranks other than the
    sender. ``store``: the whole job's store (where the phase watch publishes).
    """

    layout: SplitLayout
    rank: int
    tp_group: dist.ProcessGroup | None
    weights: SpanGroup | None
    exchange: SpanGroup | None
    store: Store

    @property
    def role(self) -> Role:
        return self.layout.role_of(self.rank)

    @property
    def is_sender(self) -> bool:
        return self.rank == SENDER


def init_split_distributed(
    layout: SplitLayout,
    *,
    rank: int,
    device: torch.device,
    timeout: timedelta,
    init_method: str | None = None,
) -> SplitGroups:
    """Rendezvous the whole job through ``init_method`` (torchrun's ``env://`` by default) and
    build this rank's groups of ``layout``; see :meth:`SplitLayout.build_groups`."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    store, _, _ = next(
        rendezvous(
            init_method or "env://", rank=rank, world_size=layout.world_size, timeout=timeout
        )
    )
    return layout.build_groups(store, rank=rank, device=device, timeout=timeout)


def every_rank_arrives(store: Store, key: str, world_size: int, timeout: timedelta) -> None:
    """Wait until each of ``world_size`` ranks has called this with ``key`` (a store barrier
    that the same ranks may pass again: each pass waits for the next multiple of the count)."""
    count = int(store.add(key, 1))
    target = -(-count // world_size) * world_size
    deadline = time.monotonic() + timeout.total_seconds()
    while int(store.add(key, 0)) < target:
        if time.monotonic() > deadline:
            raise CollectiveTimeout(
                f"{target - int(store.add(key, 0))} of {world_size} ranks did not finish their "
                f"pre-start checks within {timeout.total_seconds():.0f} s"
            )
        time.sleep(0.01)
