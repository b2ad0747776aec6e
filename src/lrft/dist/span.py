"""A process group that spans the two roles of a split placement, driven through its own methods.

In a split placement each role's ranks form the default process group of their processes (see
:mod:`lrft.dist.split`), so the group that joins the trainer's sending rank to every rollout rank
cannot be a subgroup of the default one. :class:`SpanGroup` wraps a backend created directly on
the job's store (gloo, or NCCL for device tensors) and calls its collectives itself: tensor
broadcasts, and the object messages the two sides exchange (broadcast, all-gather, and
point-to-point sends that return at once, so a side can post a result and go on).

Ranks are given as the job's global ranks; each member's index in ``members`` is its rank in the
backend. Every call waits at most the group's timeout: a peer that never arrives makes it raise
the backend's timeout error, which :class:`lrft.dist.PhaseWatch` turns into a
``CollectiveTimeout`` naming the phase.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Protocol, TypeVar, cast

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Store

T = TypeVar("T")

_SIZE = torch.int64


class Pending(Protocol):
    """A point-to-point send in flight: ``wait()`` returns once the peer has taken it."""

    def wait(self) -> object: ...


class _Sent:
    """An object send in flight: its size and payload, kept alive until both are taken."""

    def __init__(self, works: Sequence[Pending], tensors: Sequence[torch.Tensor]) -> None:
        self._works = list(works)
        self._tensors = list(tensors)

    def wait(self) -> None:
        for work in self._works:
            work.wait()
        self._works.clear()
        self._tensors.clear()


def _new_backend(
    store: Store, *, index: int, size: int, device: torch.device, timeout: timedelta
) -> Any:
    if device.type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, index, size, options)
    return dist.ProcessGroupGloo(store, index, size, timeout)


class SpanGroup:
    """Collectives over ``members`` (global ranks) through a backend of their own.

    ``device`` is where the group's tensors travel: a CUDA device makes it an NCCL group, anything
    else gloo. Object messages are pickled into byte tensors on that device.
    """

    def __init__(
        self, *, backend: Any, members: Sequence[int], rank: int, device: torch.device
    ) -> None:
        if rank not in members:
            raise ValueError(f"rank {rank} is not a member of the span group {tuple(members)}")
        self.backend = backend
        self.members = tuple(members)
        self.rank = rank
        self.device = device

    @classmethod
    def create(
        cls,
        store: Store,
        *,
        members: Sequence[int],
        rank: int,
        device: torch.device,
        timeout: timedelta,
    ) -> SpanGroup:
        """Join the group named by ``store`` (a prefix of the job's store); every member calls
        this with the same ``members``."""
        backend = _new_backend(
            store,
            index=tuple(members).index(rank),
            size=len(members),
            device=device,
            timeout=timeout,
        )
        return cls(backend=backend, members=members, rank=rank, device=device)

    @property
    def size(self) -> int:
        return len(self.members)

    def index(self, rank: int) -> int:
        """``rank``'s rank in this group."""
        try:
            return self.members.index(rank)
        except ValueError:
            raise ValueError(
                f"rank {rank} is not a member of the span group {self.members}"
            ) from None

    # --- tensors --------------------------------------------------------------------------------

    def broadcast(self, tensor: torch.Tensor, root: int) -> None:
        """``tensor`` from global rank ``root`` into every member's ``tensor`` (same shape, dtype
        and device on every member: this group's device)."""
        options = dist.BroadcastOptions()
        options.rootRank = self.index(root)
        options.rootTensor = 0
        self.backend.broadcast([tensor], options).wait()

    # --- objects --------------------------------------------------------------------------------

    def _encode(self, value: object) -> torch.Tensor:
        raw = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(self.device)

    @staticmethod
    def _decode(payload: torch.Tensor) -> Any:
        return pickle.loads(payload.to("cpu").numpy().tobytes())

    def broadcast_object(self, value: T | None, root: int) -> T:
        """``value`` from global rank ``root`` on every member (the others pass ``None``)."""
        payload = self._encode(value) if self.rank == root else None
        size = torch.zeros(1, dtype=_SIZE, device=self.device)
        if payload is not None:
            size.fill_(payload.numel())
        self.broadcast(size, root)
        if payload is None:
            payload = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)
        self.broadcast(payload, root)
        return cast(T, self._decode(payload))

    def all_gather_objects(self, value: T) -> list[T]:
        """Every member's ``value``, in the order of ``members``."""
        payload = self._encode(value)
        size = torch.tensor([payload.numel()], dtype=_SIZE, device=self.device)
        sizes = [torch.empty_like(size) for _ in self.members]
        self.backend.allgather([sizes], [size]).wait()
        longest = max(int(s.item()) for s in sizes)
        padded = torch.zeros(longest, dtype=torch.uint8, device=self.device)
        padded[: payload.numel()] = payload
        gathered = [torch.empty_like(padded) for _ in self.members]
        self.backend.allgather([gathered], [padded]).wait()
        return [
            cast(T, self._decode(data[: int(s.item())]))
            for data, s in zip(gathered, sizes, strict=True)
        ]

    def send_object(self, value: object, to: int, *, tag: int) -> Pending:
        """Post ``value`` to global rank ``to`` under ``tag`` and return at once; the peer takes
        messages of one tag in the order they were sent. ``wait()`` on the result before the
        program ends (a send not taken by then is lost)."""
        payload = self._encode(value)
        size = torch.tensor([payload.numel()], dtype=_SIZE, device=self.device)
        peer = self.index(to)
        works = [self.backend.send([size], peer, tag), self.backend.send([payload], peer, tag)]
        return _Sent(works, [size, payload])

    def recv_object(self, source: int, *, tag: int) -> Any:
        """The next object global rank ``source`` sent to this rank under ``tag``."""
        peer = self.index(source)
        size = torch.empty(1, dtype=_SIZE, device=self.device)
        self.backend.recv([size], peer, tag).wait()
        payload = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)
        self.backend.recv([payload], peer, tag).wait()
        return self._decode(payload)
