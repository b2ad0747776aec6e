"""Object collectives and the TP-group generate used by tensor-parallel rollout engines."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar, cast

import attrs
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions

from lrft.api.errors import LrftError
from lrft.api.types import GenerationRequest, GenerationResult, SamplingParams

T = TypeVar("T")

GenerateFn = Callable[[Sequence[GenerationRequest], SamplingParams], list[GenerationResult]]


def all_gather_into(
    output: torch.Tensor,
    local: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    *,
    async_op: bool = False,
) -> dist.Work | None:
    """``output`` = every rank's ``local``, concatenated in rank order. Collective.

    With ``async_op`` the collective is only issued and its work handle returned: ``output`` may
    be read, and ``local`` freed or written, only after the handle's ``wait()`` (on a GPU, that
    orders the current stream after the collective). Without it, returns None once ``output``
    is ready to read on the current stream.

    torch 2.13 renamed ``all_gather_into_tensor`` to ``all_gather_single`` (the old name warns);
    earlier releases have only the old one.
    """
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    work = gather(output, local, group=group, async_op=async_op)
    return cast("dist.Work | None", work)


def all_gather_into_many(
    outputs: Sequence[torch.Tensor],
    inputs: Sequence[torch.Tensor],
    group: dist.ProcessGroup | None = None,
    *,
    async_op: bool = False,
) -> dist.Work | None:
    """``outputs[i]`` = every rank's ``inputs[i]``, concatenated in rank order, for every ``i``,
    as one coalesced collective (with NCCL, one group: a single launch, however many tensors).
    Each output has ``world`` times its input's elements; all share one dtype. Collective.
    ``async_op`` as in :func:`all_gather_into`; a backend that orders the collective on the
    current stream may return None even then.

    The process group is called directly, as torch's own coalescing manager does: going through
    ``torch.distributed``'s per-tensor wrapper inside that manager costs tens of microseconds
    of host time per tensor, more than the collective of a small tensor. torch 2.13 names the
    method ``all_gather_single_coalesced``; earlier releases ``allgather_into_tensor_coalesced``.
    """
    if len(outputs) != len(inputs):
        raise ValueError(f"{len(outputs)} outputs for {len(inputs)} inputs")
    process_group = group if group is not None else dist.group.WORLD
    assert isinstance(process_group, dist.ProcessGroup), "the default process group is not set"
    options = AllgatherOptions()
    if hasattr(options, "asyncOp"):
        options.asyncOp = async_op
    method = getattr(process_group, "all_gather_single_coalesced", None)
    if method is None:
        method = process_group.allgather_into_tensor_coalesced
    work = cast("dist.Work | None", method(list(outputs), list(inputs), options))
    # None: the backend ran the collective on the current stream (as NCCL does in torch 2.11
    # for a synchronous call), so the outputs are ready to read on it
    if async_op or work is None:
        return work
    work.wait()
    return None


def all_gather_objects(value: T, group: dist.ProcessGroup | None = None) -> list[T]:
    """Every rank's ``value`` in group-rank order. Collective over ``group``."""
    size = dist.get_world_size(group)
    gathered: list[T | None] = [None] * size
    dist.all_gather_object(gathered, value, group=group)
    return cast(list[T], gathered)


def broadcast_object(value: T | None, src: int, group: dist.ProcessGroup | None = None) -> T:
    """``value`` from global rank ``src`` on every rank of ``group``. Collective over ``group``."""
    box: list[T | None] = [value]
    dist.broadcast_object_list(box, src=src, group=group)
    result = box[0]
    assert result is not None, "broadcast_object received None from the source rank"
    return result


def tp_group_generate(
    generate: GenerateFn,
    requests: Sequence[GenerationRequest],
    params: SamplingParams,
    group: dist.ProcessGroup | None,
) -> list[GenerationResult]:
    """Generate once for a whole TP group and hand each rank exactly its own results.

    Collective over ``group``: the group's requests are gathered in group-rank order, ``generate``
    runs on the concatenation on every rank (an SPMD engine computes it once across the group),
    and each rank keeps the slice that belongs to its own requests, in their order. Each returned
    result is checked against its request's prompt, so an engine that reorders results fails here
    rather than silently pairing completions with the wrong prompts.

    The group makes one call, so its ranks pass equal ``params`` (the seed included: unseeded,
    the ranks of an SPMD engine would draw from their own random streams). Params that differ
    raise ``LrftError`` on every rank of the group alike, naming the ranks and the fields, before
    anything is generated.
    """
    if group is None or dist.get_world_size(group) == 1:
        return _checked(generate(requests, params), requests, params)
    per_rank = all_gather_objects((list(requests), params), group)
    _check_equal_params([rank_params for _, rank_params in per_rank], group)
    everything = [request for rank_requests, _ in per_rank for request in rank_requests]
    results = _checked(generate(everything, params), everything, params)
    me = dist.get_rank(group)
    start = sum(len(rank_requests) for rank_requests, _ in per_rank[:me]) * params.n
    return results[start : start + len(requests) * params.n]


def _check_equal_params(per_rank: Sequence[SamplingParams], group: dist.ProcessGroup) -> None:
    """Every rank of ``group`` sees the same gathered list, so all raise or none does."""
    first = per_rank[0]
    ranks = dist.get_process_group_ranks(group)
    for rank, params in zip(ranks, per_rank, strict=True):
        if params != first:
            fields = [
                f"{field.name} {getattr(params, field.name)!r} (rank {ranks[0]}: "
                f"{getattr(first, field.name)!r})"
                for field in attrs.fields(SamplingParams)
                if getattr(params, field.name) != getattr(first, field.name)
            ]
            raise LrftError(
                f"the ranks of TP group {ranks} passed different SamplingParams to one generate: "
                f"rank {rank} passed {', '.join(fields)}. A TP group makes one call: pass every "
                "rank of it equal parameters, the seed included"
            )


def _checked(
    results: list[GenerationResult],
    requests: Sequence[GenerationRequest],
    params: SamplingParams,
) -> list[GenerationResult]:
    expected = len(requests) * params.n
    if len(results) != expected:
        raise LrftError(
            f"engine returned {len(results)} results for {len(requests)} requests x n={params.n} "
            f"(expected {expected})"
        )
    for index, result in enumerate(results):
        request = requests[index // params.n]
        if (
            result.prompt_token_ids != request.prompt_token_ids
            or result.sample_index != index % params.n
        ):
            raise LrftError(
                f"engine result {index} (request_id {result.request_id!r}, sample "
                f"{result.sample_index}) does not belong to request {index // params.n} "
                f"(request_id {request.request_id!r}, sample {index % params.n}): results must be "
                "request-major and in request order"
            )
    return results


def mean_over_ranks(values: dict[str, float]) -> dict[str, float]:
    """Each metric averaged over the ranks that report it (same keys on every rank expected)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return dict(values)
    gathered = all_gather_objects(values)
    keys = sorted({key for part in gathered for key in part})
    return {
        key: sum(p[key] for p in gathered if key in p) / sum(1 for p in gathered if key in p)
        for key in keys
    }


def sum_over_ranks(values: list[float], device: torch.device) -> list[float]:
    """Element-wise sums over every rank; ``device`` is this rank's (NCCL reduces device tensors
    only, gloo host tensors)."""
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor)
    return [float(x) for x in tensor.tolist()]


def max_over_ranks(count: int, device: torch.device) -> int:
    """The largest ``count`` of any rank: how many collective forwards every rank must run when
    each has its own number of micro-batches (``device`` as in :func:`sum_over_ranks`)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return count
    tensor = torch.tensor([count], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())
