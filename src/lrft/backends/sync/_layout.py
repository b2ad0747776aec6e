"""What a ``DirectSync`` remembers of one engine layout between syncs: the buckets its checks
passed (with, writing in place, each bucket's copy plan and the addresses it writes to), the
last complete sequence of buckets, and the sums and host buffers of an in-place sync."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
import torch

from lrft.api.protocols import InPlaceWeightLoader
from lrft.api.types import TensorSpec
from lrft.backends.sync._copy_plan import CopyPlan
from lrft.backends.sync._digests import CombinedDigest

_NOTHING = torch.empty(0)


@attrs.define(kw_only=True)
class Bucket:
    """A bucket the checks passed: its engine names, specs and shapes, and, writing in place,
    its weights' rows in the digest sums and the copy plan it last ran through, with the
    addresses that plan writes to."""

    names: list[str]
    specs: list[TensorSpec]
    shapes: list[torch.Size]
    nbytes: int
    positions: list[int]
    plan: CopyPlan | None = None
    # the addresses of the targets the plan writes to, as lent when it was made
    plan_targets: list[int] = attrs.field(factory=list)

    def targets(self, lent: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """This bucket's weights' targets among every weight's, lent in the digest order."""
        return list(map(lent.__getitem__, self.positions))


class Layout:
    """What is known of one engine layout: its specs, the engine's digest order when writing
    in place, the buckets checked against them, the last sequence of buckets found complete,
    and the sums buffer and report layout of an in-place sync."""

    def __init__(self, specs: Mapping[str, TensorSpec], order: Sequence[str] | None) -> None:
        self.specs = dict(specs)
        self.names = list(specs)
        self.spec_values = list(specs.values())
        dtypes = {spec.dtype for spec in self.spec_values}
        self.gather_dtype = dtypes.pop() if len(dtypes) == 1 else None
        self.order_given = order
        # a tuple, the same object every sync: what an in-place sync lends, all at once
        self.order: tuple[str, ...] | None = None if order is None else tuple(order)
        self.positions = {} if order is None else {name: i for i, name in enumerate(order)}
        self.buckets: dict[tuple[str, ...], Bucket] = {}
        self.complete: list[Bucket] = []
        # where in the lent list the first lent target is (0 unless only changes are lent)
        self.first_lent = 0
        self._changed: dict[frozenset[str], tuple[tuple[str, ...], torch.Tensor]] = {}
        self._sums: torch.Tensor | None = None
        self._sums_zeroed = False  # zeroed ahead, by the end of the last sync that used them
        self._report: CombinedDigest | None = None
        self._host: tuple[torch.Tensor, torch.cuda.Event, torch.cuda.Event, torch.device] | None = (
            None
        )

    def describes(self, specs: Mapping[str, TensorSpec], order: Sequence[str] | None) -> bool:
        # List equality tries identity first: an engine that hands out the same spec objects
        # sync after sync costs one pointer comparison per weight.
        return (
            len(specs) == len(self.spec_values)
            and list(specs.values()) == self.spec_values
            and list(specs) == self.names
            and (
                order is self.order_given or (None if order is None else tuple(order)) == self.order
            )
        )

    def lend(self, load: InPlaceWeightLoader) -> list[torch.Tensor]:
        """Every weight's target, in the digest order."""
        assert self.order is not None
        self.first_lent = 0
        return load.targets(self.order)

    def lend_changed(
        self, load: InPlaceWeightLoader, changed: frozenset[str]
    ) -> list[torch.Tensor]:
        """The targets of the ``changed`` weights only (lending counts as loading), at their
        places in the digest order; the other places hold an empty tensor."""
        assert self.order is not None
        order, _ = self._changes(changed)
        lent = [_NOTHING] * len(self.order)
        for name, target in zip(order, load.targets(order), strict=True):
            lent[self.positions[name]] = target
        self.first_lent = self.positions[order[0]] if order else 0
        return lent

    def unchanged_rows(self, changed: frozenset[str]) -> torch.Tensor:
        """The rows, in the digest order, of the weights not in ``changed`` (on the host)."""
        return self._changes(changed)[1]

    def _changes(self, changed: frozenset[str]) -> tuple[tuple[str, ...], torch.Tensor]:
        # kept per set of names: the lifecycle knows a tuple of names it saw by its identity
        if changed not in self._changed:
            assert self.order is not None
            order = tuple(name for name in self.order if name in changed)
            rows = [i for i, name in enumerate(self.order) if name not in changed]
            self._changed[changed] = (order, torch.tensor(rows, dtype=torch.long))
        return self._changed[changed]

    def sums(self, device: torch.device) -> torch.Tensor:
        """The buffer an in-place sync sums what it writes into, zeroed; at one address sync
        after sync, since the copy plans' graphs write to it."""
        assert self.order is not None
        if self._sums is None or self._sums.device != device:
            self._sums = torch.zeros((len(self.order), 2), dtype=torch.int64, device=device)
        elif not self._sums_zeroed:
            self._sums.zero_()
        self._sums_zeroed = False
        return self._sums

    def zero_sums_ahead(self) -> None:
        """Zeroes the sums for the next sync, queued behind this sync's reads of them (the
        caller then waits for it), so that no launch (tens of microseconds on a slow host)
        comes before the next sync's first copy."""
        assert self._sums is not None
        self._sums.zero_()
        self._sums_zeroed = True

    def host_sums(
        self, device: torch.device
    ) -> tuple[torch.Tensor, torch.cuda.Event, torch.cuda.Event]:
        """Pinned host memory for the sent and held sums, and the events their copies from
        ``device`` record, kept from sync to sync."""
        assert self.order is not None
        if self._host is None or self._host[3] != device:
            both = torch.empty((2, len(self.order), 2), dtype=torch.int64, pin_memory=True)
            events = torch.cuda.Event(), torch.cuda.Event()  # type: ignore[no-untyped-call]  # unannotated in torch
            self._host = (both, *events, device)
        return self._host[:3]

    def report(self) -> CombinedDigest:
        assert self.order is not None
        if self._report is None:
            self._report = CombinedDigest(self.order, [self.specs[name] for name in self.order])
        return self._report


@attrs.define
class MemoSlot:
    layout: Layout | None = None

    def layout_for(self, specs: Mapping[str, TensorSpec], order: Sequence[str] | None) -> Layout:
        if self.layout is None or not self.layout.describes(specs, order):
            self.layout = Layout(specs, order)
        return self.layout
