"""The groups a SplitLayout builds, on gloo ranks: each role's default group holds exactly its
ranks, the TP groups their members, and the span groups carry tensors and objects between the
sender and every rollout rank (a sent object waits for its receiver without blocking the sender,
so a side can post a result and take part in a broadcast before the peer reads it)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from lrft.dist import SplitLayout
from lrft.testing.distributed import current_rank_context, current_split_groups, shared_pool

LAYOUT = SplitLayout(world_size=4, rollout_world_size=2, tp_size=2)


def _rank_sum(group: dist.ProcessGroup | None) -> int:
    value = torch.tensor([current_rank_context().rank])
    dist.all_reduce(value, group=group)
    return int(value.item())


def _check_groups() -> dict[str, object]:
    groups = current_split_groups()
    rank = groups.rank
    layout = groups.layout
    mine = layout.train_ranks if groups.role == "train" else layout.rollout_ranks
    found: dict[str, object] = {
        "role": groups.role,
        "default_size": dist.get_world_size(),
        "default_sum": _rank_sum(None),
        "expected_sum": sum(mine),
    }
    if groups.role == "rollout":
        found["tp_sum"] = _rank_sum(groups.tp_group)
        found["tp_expected"] = sum(layout.tp_group_of(rank))
    if groups.weights is not None and groups.exchange is not None:
        weights, exchange = groups.weights, groups.exchange
        tensor = torch.arange(5.0) * 3 if rank == 0 else torch.zeros(5)
        weights.broadcast(tensor, root=0)
        found["broadcast"] = tensor.tolist()
        found["object"] = exchange.broadcast_object({"from": rank} if rank == 2 else None, root=2)
        found["gathered"] = exchange.all_gather_objects(rank * 10)
        if rank == 0:
            # the rollout ranks sent before the broadcast below; the sender reads after it
            exchange.broadcast_object("after", root=0)
            found["received"] = [exchange.recv_object(peer, tag=1) for peer in (3, 2)]
        else:
            pending = exchange.send_object(("sample", rank), 0, tag=1)
            exchange.broadcast_object(None, root=0)
            pending.wait()
    return found


def test_roles_tp_and_span_groups_hold_the_layout_ranks() -> None:
    results = shared_pool(LAYOUT.world_size, split=LAYOUT).run(_check_groups)
    for rank, found in enumerate(results):
        assert found["role"] == LAYOUT.role_of(rank)
        assert found["default_size"] == LAYOUT.role_world_size(rank)
        assert found["default_sum"] == found["expected_sum"]
        if found["role"] == "rollout":
            assert found["tp_sum"] == found["tp_expected"] == 2 + 3
        if rank in LAYOUT.span_ranks:
            assert found["broadcast"] == [0.0, 3.0, 6.0, 9.0, 12.0]
            assert found["object"] == {"from": 2}
            assert found["gathered"] == [0, 20, 30]
        else:
            assert "broadcast" not in found
    assert results[0]["received"] == [("sample", 3), ("sample", 2)]
