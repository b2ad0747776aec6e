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
from lrft.dist.collectives import all_gather_into_many
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


def _passes_follow_the_shards_and_free_what_was_handed_out() -> list[str]:
    """Several passes over the same model, at two bounds and back, with the shards changed in
    place between passes: every pass yields the shards as they are now (the kept gather plans
    cast them again), and a bucket handed out holds no memory once the next one is asked for
    or the pass is over."""
    expected, frozen = _sharded_uneven(3)
    problems: list[str] = []

    def one_pass(bound: int, scale: float, what: str) -> None:
        handed_out: list[torch.Tensor] = []
        for bucket in frozen.full_weights(bound, gather_dtype=torch.bfloat16):
            if handed_out and handed_out[-1].untyped_storage().nbytes() != 0:
                problems.append(f"{what}: the previous bucket still holds memory")
            for name, tensor in bucket:
                reference = (expected[name] * scale).to(torch.bfloat16)
                if not torch.equal(tensor, reference):
                    problems.append(f"{what}: {name}")
            handed_out.append(bucket[0][1])
        if any(tensor.untyped_storage().nbytes() != 0 for tensor in handed_out):
            problems.append(f"{what}: a bucket holds memory after the pass")

    one_pass(64, 1.0, "first pass")
    with torch.no_grad():
        for param in frozen.module.parameters():
            assert isinstance(param, DTensor)
            param._local_tensor.mul_(2)
    one_pass(64, 2.0, "after the shards changed")
    one_pass(1 << 20, 2.0, "another bound")
    one_pass(64, 2.0, "the first bound again")
    return problems


def _second_pass_while_one_is_open() -> tuple[str, list[str]]:
    """A second pass started while the first has handed out a bucket is refused (before any
    collective, on every rank); once the first is closed a full pass is exact."""
    from lrft.api.errors import LrftError

    expected, frozen = _sharded_uneven(4)
    first = frozen.full_weights(64)
    assert isinstance(first, Generator)
    next(first)
    try:
        next(frozen.full_weights(64))
        refused = ""
    except LrftError as exc:
        refused = str(exc)
    first.close()
    wrong = [
        name
        for bucket in frozen.full_weights(64)
        for name, tensor in bucket
        if not torch.equal(tensor, expected[name])
    ]
    return refused, wrong


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

    def test_passes_follow_the_shards_and_free_what_was_handed_out(self, pool: RankPool) -> None:
        assert pool.run(_passes_follow_the_shards_and_free_what_was_handed_out) == [[], []]

    def test_a_second_pass_while_one_is_open_is_refused(self, pool: RankPool) -> None:
        for refused, wrong in pool.run(_second_pass_while_one_is_open):
            assert "another pass over this model's weights is still open" in refused
            assert wrong == []

    def test_closing_early_on_every_rank_leaves_them_paired(self, pool: RankPool) -> None:
        assert pool.run(_closed_early_then_gathered_again) == [[], []]


def _rank_input(rank: int, index: int, shape: tuple[int, ...]) -> torch.Tensor:
    count = 1
    for size in shape:
        count *= size
    return (torch.arange(count, dtype=torch.float32) + 1000 * rank + 100 * index).view(shape)


def _coalesced_gathers_match_concatenation(async_op: bool) -> list[bool]:
    """Tensors of several shapes (2-D, 1-D, 3-D and empty) gathered in one coalesced call, each
    compared with the concatenation of every rank's input in rank order, built here."""
    rank = current_rank_context().rank
    shapes = [(3, 4), (5,), (2, 3, 2), (0, 4)]
    world = torch.distributed.get_world_size()
    inputs = [_rank_input(rank, i, shape) for i, shape in enumerate(shapes)]
    outputs = [torch.full((world * shape[0], *shape[1:]), -1.0) for shape in shapes]
    work = all_gather_into_many(outputs, inputs, async_op=async_op)
    assert (work is not None) == async_op
    if work is not None:
        work.wait()
    return [
        torch.equal(out, torch.cat([_rank_input(r, i, shape) for r in range(world)]))
        for i, (out, shape) in enumerate(zip(outputs, shapes, strict=True))
    ]


class TestAllGatherIntoManyWorld2(DistributedSuite):
    world_size = 2

    @pytest.mark.parametrize("async_op", [False, True])
    def test_each_output_is_every_ranks_input_in_rank_order(
        self, pool: RankPool, async_op: bool
    ) -> None:
        assert pool.run(_coalesced_gathers_match_concatenation, async_op) == [[True] * 4] * 2


def test_all_gather_into_many_pairs_outputs_with_inputs_before_any_collective() -> None:
    with pytest.raises(ValueError, match="2 outputs for 1 inputs"):
        all_gather_into_many([torch.zeros(2), torch.zeros(2)], [torch.zeros(1)])


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
