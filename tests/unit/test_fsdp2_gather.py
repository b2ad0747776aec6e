"""FSDP2 full weights gathered one collective per bucket equal the unsharded tensors, including
dimensions that do not divide by the world size and ranks whose shard is empty."""

from __future__ import annotations

import warnings
from collections.abc import Generator
from typing import TYPE_CHECKING, NamedTuple

import pytest
import torch
from torch.distributed.tensor import DTensor

from lrft.backends.train._fsdp2_gather import gather_full
from lrft.testing.distributed import DistributedSuite, RankPool, current_rank_context
from lrft.testing.models import tiny_causal_lm

if TYPE_CHECKING:
    from lrft.backends.train._fsdp2_models import FSDP2FrozenModel


class _Uneven(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(3, 5)  # 5 rows over 2 ranks: 3 and 2
        self.second = torch.nn.Linear(5, 1)  # 1 row: rank 1 holds none
        self.table = torch.nn.Parameter(torch.randn(7, 2, 3))  # 3-D, 4 and 3 rows
        self.low = torch.nn.Parameter(torch.randn(3, 4).to(torch.bfloat16))  # another dtype


def _sharded_uneven(seed: int) -> tuple[dict[str, torch.Tensor], FSDP2FrozenModel]:
    """A seeded ``_Uneven`` model's unsharded tensors, and the model sharded for inference over
    the pool's ranks."""
    from lrft.backends.train.fsdp2 import FSDP2Backend

    current_rank_context()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _Uneven()
    expected = {name: p.detach().clone() for name, p in model.named_parameters()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no decoder layers: one FSDP2 unit, as intended here
        frozen = FSDP2Backend().prepare_frozen(model)
    return expected, frozen


def _gathered_equal_unsharded(bucket_bytes: int) -> tuple[bool, int, list[str]]:
    expected, frozen = _sharded_uneven(0)
    names: list[str] = []
    equal = True
    buckets = 0
    for bucket in frozen.full_weights(bucket_bytes):
        buckets += 1
        for name, tensor in bucket:
            names.append(name)
            reference = expected[name]
            equal &= tensor.dtype == reference.dtype and torch.equal(tensor, reference)
    # the same through gather_full directly, all parameters in one call
    direct = gather_full(list(frozen.module.named_parameters()), torch.device("cpu"))
    equal &= all(torch.equal(tensor, expected[name]) for name, tensor in direct)
    return equal, buckets, names


class TestGatherWorld2(DistributedSuite):
    world_size = 2

    @pytest.mark.parametrize(("bucket_bytes", "buckets"), [(1 << 20, 1), (64, 4)])
    def test_buckets_hold_the_unsharded_tensors(
        self, pool: RankPool, bucket_bytes: int, buckets: int
    ) -> None:
        for equal, count, names in pool.run(_gathered_equal_unsharded, bucket_bytes):
            assert equal
            assert count == buckets
            assert names == [
                "table",
                "low",
                "first.weight",
                "first.bias",
                "second.weight",
                "second.bias",
            ]


def _gathered_in(gather_dtype: torch.dtype) -> dict[str, tuple[torch.dtype, bool]]:
    """Each full tensor's dtype, and whether it equals the unsharded tensor cast to it."""
    expected, frozen = _sharded_uneven(0)
    return {
        name: (tensor.dtype, torch.equal(tensor, expected[name].to(tensor.dtype)))
        for bucket in frozen.full_weights(1 << 20, gather_dtype=gather_dtype)
        for name, tensor in bucket
    }


class TestGatherDtypeWorld2(DistributedSuite):
    world_size = 2

    def test_shards_are_cast_before_the_all_gather(self, pool: RankPool) -> None:
        for result in pool.run(_gathered_in, torch.float16):
            # every floating-point parameter, fp32 and bf16 alike, travels in the asked dtype
            assert result == {name: (torch.float16, True) for name in result}


class _BucketFacts(NamedTuple):
    buckets: int
    names: list[str]  # as yielded, every bucket in turn
    module_order: list[str]
    wrong: list[str]  # tensors that differ from the reference, or are not contiguous


def _bf16_buckets_match_full_tensor(bucket_bytes: int) -> _BucketFacts:
    """Each tensor, checked as it is handed out (while the next bucket's all-gather is in
    flight), against DTensor's own ``full_tensor()`` of the sharded parameter, cast to bf16."""
    _, frozen = _sharded_uneven(1)
    named = list(frozen.module.named_parameters())
    reference = {
        name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().to(torch.bfloat16)
        for name, p in named
    }
    buckets = 0
    names: list[str] = []
    wrong: list[str] = []
    for bucket in frozen.full_weights(bucket_bytes, gather_dtype=torch.bfloat16):
        buckets += 1
        for name, tensor in bucket:
            names.append(name)
            if not (tensor.is_contiguous() and tensor.dtype == torch.bfloat16):
                wrong.append(f"{name}: layout or dtype")
            elif not torch.equal(tensor, reference[name]):
                wrong.append(f"{name}: values")
    return _BucketFacts(buckets, names, [name for name, _ in named], wrong)


def _closed_early_then_gathered_again() -> list[str]:
    """Every rank stops after the first bucket, with the second one's all-gather issued; the
    next full pass must still pair every rank's collectives. Returns the mismatched names."""
    expected, frozen = _sharded_uneven(2)
    stream = frozen.full_weights(64, gather_dtype=torch.bfloat16)
    assert isinstance(stream, Generator)
    next(stream)
    stream.close()
    return [
        name
        for bucket in frozen.full_weights(64)
        for name, tensor in bucket
        if not torch.equal(tensor, expected[name])
    ]


class TestPipelinedBucketsWorld2(DistributedSuite):
    world_size = 2

    # bf16 sizes in module order: table 84 B, low 24, first.weight 30, first.bias 10,
    # second.weight 10, second.bias 2 (rows 7, 3, 5, 5, 1, 1 over 2 ranks)
    @pytest.mark.parametrize(("bucket_bytes", "buckets"), [(1, 6), (64, 3), (1 << 20, 1)])
    def test_every_bucket_equals_full_tensor_cast(
        self, pool: RankPool, bucket_bytes: int, buckets: int
    ) -> None:
        for facts in pool.run(_bf16_buckets_match_full_tensor, bucket_bytes):
            assert facts.wrong == []
            assert facts.names == facts.module_order
            assert facts.buckets == buckets

    def test_closing_early_on_every_rank_leaves_them_paired(self, pool: RankPool) -> None:
        assert pool.run(_closed_early_then_gathered_again) == [[], []]


def _dtypes_on_one_rank() -> set[torch.dtype]:
    return {dtype for dtype, _ in _gathered_in(torch.float16).values()}


class TestGatherDtypeWorld1(DistributedSuite):
    world_size = 1

    def test_one_rank_gathers_nothing_and_casts_nothing(self, pool: RankPool) -> None:
        assert pool.run(_dtypes_on_one_rank) == [{torch.float32, torch.bfloat16}]


def _local_buckets_across_calls() -> list[str]:
    """One rank keeps the last call's bucket bounds and checks them bucket by bucket: a new
    bound, the old bound again, and shards whose sizes change part-way through the model must
    all give greedy buckets of the shards as they are now."""
    from lrft.api.optim import OptimizerConfig
    from lrft.backends.train.fsdp2 import FSDP2Backend, FSDP2Config
    from lrft.testing.conformance._train_checks import check_buckets

    model = tiny_causal_lm(seed=3)
    trainable = FSDP2Backend(FSDP2Config(mixed_precision=False)).prepare_trainable(
        model, optimizer=OptimizerConfig(lr=1e-2)
    )
    params = dict(trainable.module.named_parameters())
    problems: list[str] = []

    def collect(bound: int, what: str) -> None:
        buckets = [list(b) for b in trainable.full_weights(bound)]
        check_buckets(buckets, bound, what)
        for name, tensor in (pair for bucket in buckets for pair in bucket):
            local = params[name]
            expected = local.to_local() if isinstance(local, DTensor) else local
            if tensor.dtype != expected.dtype or not torch.equal(tensor, expected):
                problems.append(f"{what}: {name}")

    for bound in (4096, 64 * 1024, 4096, 64 * 1024):
        collect(bound, f"bound {bound}")
    # the second half of the shards doubles in size (as a cast of those parameters would)
    late = [p for p in params.values() if isinstance(p, DTensor)][len(params) // 2 :]
    for param in late:
        param._local_tensor = param._local_tensor.double()
    collect(64 * 1024, "after a size change")
    return problems


class TestLocalBucketsWorld1(DistributedSuite):
    world_size = 1

    def test_bounds_follow_the_bound_and_the_shards_sizes(self, pool: RankPool) -> None:
        assert pool.run(_local_buckets_across_calls) == [[]]
