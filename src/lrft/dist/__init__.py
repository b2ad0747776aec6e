"""Distributed primitives: torchrun's environment, rollout topology, the split placement,
start-up, collectives, and the phase watch that names a stalled rank."""

from lrft.dist.collectives import (
    GenerateFn,
    all_gather_into,
    all_gather_into_many,
    all_gather_objects,
    broadcast_object,
    mean_over_ranks,
    max_over_ranks,
    sum_over_ranks,
    tp_group_generate,
)
from lrft.dist.init import DEFAULT_TIMEOUT, backend_for, close_distributed, init_distributed
from lrft.dist.layout import RolloutGroups, RolloutLayout
from lrft.dist.rank import RankInfo
from lrft.dist.span import SpanGroup
from lrft.dist.split import (
    Role,
    SplitGroups,
    SplitLayout,
    every_rank_arrives,
    init_split_distributed,
)
from lrft.dist.watchdog import PhaseWatch, is_collective_timeout

__all__ = [
    "DEFAULT_TIMEOUT",
    "GenerateFn",
    "PhaseWatch",
    "RankInfo",
    "Role",
    "RolloutGroups",
    "RolloutLayout",
    "SpanGroup",
    "SplitGroups",
    "SplitLayout",
    "all_gather_into",
    "all_gather_into_many",
    "all_gather_objects",
    "backend_for",
    "broadcast_object",
    "close_distributed",
    "init_distributed",
    "every_rank_arrives",
    "init_split_distributed",
    "is_collective_timeout",
    "mean_over_ranks",
    "max_over_ranks",
    "sum_over_ranks",
    "tp_group_generate",
]
