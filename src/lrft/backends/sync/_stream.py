"""One ``DirectSync`` pass: the buckets checked against the engine layout, loaded (cast into a
digest buffer, or written in place through copy plans), checked complete, and verified against
the engine's digest; sending changes only, against the digests of the weights left in place."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterable, Mapping
from typing import TypeGuard

import attrs
import torch

from lrft.api.digest import combine_digests, format_digests
from lrft.api.errors import WeightSyncError
from lrft.api.protocols import InPlaceWeightLoader, RolloutEngine, WeightLoader
from lrft.api.types import TensorSpec
from lrft.backends.sync._copy_plan import CopyPlan
from lrft.backends.sync._digests import PendingDigests
from lrft.backends.sync._held import Held, HeldDigests
from lrft.backends.sync._layout import Bucket, Layout
from lrft.kernels import DigestBuffer

# Bounds the buckets remembered per engine layout: a source whose buckets never repeat
# (gathered into new buffers with new names) would otherwise grow the memo without end.
_MAX_BUCKETS = 4096

_NAME = operator.itemgetter(0)
_TENSOR = operator.itemgetter(1)
_SHAPE = operator.attrgetter("shape")


@attrs.define
class Stream:
    layout: Layout
    name_map: Callable[[str], str]
    verify: bool
    # Writing in place: the engine's loader, every weight's target (lent at once, in the
    # engine's digest order), and the sums of what was written there, on the device.
    in_place: InPlaceWeightLoader | None
    # Sending changes only: what the engine holds from the last sync (digests of every weight),
    # and the engine names of the weights sent now; both None for a complete sync.
    held: Held | None = None
    changed: frozenset[str] | None = None
    lent: list[torch.Tensor] = attrs.field(factory=list)
    sent_sums: torch.Tensor | None = None
    # The buckets as checked, in the order they came; duplicates and gaps are looked for once
    # the stream is drained (a failed sync leaves the engine stale, whatever it wrote).
    sent: list[Bucket] = attrs.field(factory=list)
    # Queued on the device bucket by bucket and read back once at the end: a host sync per
    # tensor (or per bucket) would stall the stream of gathers and copies.
    sent_digests: PendingDigests = attrs.field(factory=PendingDigests)
    buckets: int = 0
    # What verification found the engine to hold, for the next sync to compare with.
    verified_digests: dict[str, str] | None = None
    verified_sums: torch.Tensor | None = None

    def run(self, buckets: Iterable[list[tuple[str, torch.Tensor]]], load: WeightLoader) -> None:
        error: Exception | None = None
        failed_bucket = -1
        for bucket in buckets:
            if error is not None:
                continue  # drain: peers still gather the remaining buckets with us
            try:
                self._load(bucket, load)
            except Exception as exc:  # raised after draining, never mid-collective
                error, failed_bucket = exc, self.buckets
            self.buckets += 1
        if isinstance(error, WeightSyncError):
            raise error
        if error is not None:
            raise WeightSyncError(f"loading bucket {failed_bucket} failed: {error}") from error

    def _load(self, bucket: list[tuple[str, torch.Tensor]], load: WeightLoader) -> None:
        if not bucket:
            return
        tensors = list(map(_TENSOR, bucket))
        key = tuple(map(_NAME, bucket))
        known = self.layout.buckets.get(key)
        if self.in_place is not None and known is not None and self._rerun(known, tensors):
            # The plan's check of the sources covers their shapes, the entry's when planned.
            self.sent.append(known)
            return
        entry = self._checked(key, known, bucket, tensors)
        self.sent.append(entry)
        if not self.verify:
            # The engine casts while it copies: no intermediate copy of the bucket.
            load(list(zip(entry.names, tensors, strict=True)))
        elif self.in_place is not None:
            # One cast copy straight into the engine's storage; the sent fingerprint is taken
            # from the values as they are written.
            self._lend(self.in_place)
            targets = entry.targets(self.lent)
            plan = entry.plan = CopyPlan(tensors, targets, entry.positions, targets[0].device)
            entry.plan_targets = list(map(torch.Tensor.data_ptr, targets))
            assert self.sent_sums is not None
            plan.run(tensors, targets, self.sent_sums)
        else:
            # The cast must exist to be fingerprinted, so it is written, in one fused copy,
            # into a buffer laid out for digests; the engine then copies from it.
            cast = DigestBuffer(
                [(spec.shape, spec.dtype) for spec in entry.specs], tensors[0].device
            )
            torch._foreach_copy_(cast.views, tensors)
            self.sent_digests.add_buffer(entry.names, cast)
            load(list(zip(entry.names, cast.views, strict=True)))

    def _lend(self, load: InPlaceWeightLoader) -> None:
        if self.sent_sums is None:
            # Every weight is lent at once, the first time a bucket needs one: one call into
            # the engine per sync, however many buckets. Sending changes only, only the
            # changed weights are lent (lending counts as loading).
            if self.changed is None:
                self.lent = self.layout.lend(load)
            else:
                self.lent = self.layout.lend_changed(load, self.changed)
            self.sent_sums = self.layout.sums(self.lent[self.layout.first_lent].device)

    def _rerun(self, entry: Bucket, tensors: list[torch.Tensor]) -> bool:
        """Writes a known bucket in place through its plan, if the plan still holds: the
        targets where they were when it was made, the sources where and as they were.

        Addresses alone decide for the targets, because a lent target always has its weight's
        shape, dtype and layout (the rollout conformance suite checks that). They are compared
        bucket by bucket, not all at once when the weights are lent: the first bucket's copy
        then starts after a bucket's worth of checks, and the rest are made while it runs."""
        assert self.in_place is not None
        plan = entry.plan
        if plan is None:
            return False
        self._lend(self.in_place)
        targets = entry.targets(self.lent)
        if list(
            map(torch.Tensor.data_ptr, targets)
        ) != entry.plan_targets or not plan.matches_sources(tensors):
            return False
        assert self.sent_sums is not None
        plan.run(tensors, targets, self.sent_sums)
        return True

    def _checked(
        self,
        key: tuple[str, ...],
        known: Bucket | None,
        bucket: list[tuple[str, torch.Tensor]],
        tensors: list[torch.Tensor],
    ) -> Bucket:
        """The bucket's checked entry: the known one if its tensors' shapes are the same
        (C calls per tensor), else checked in full."""
        if known is not None and list(map(_SHAPE, tensors)) == known.shapes:
            return known
        entry = self._check(bucket)
        buckets = self.layout.buckets
        if len(buckets) >= _MAX_BUCKETS:
            buckets.clear()
        buckets[key] = entry
        return entry

    def _check(self, bucket: list[tuple[str, torch.Tensor]]) -> Bucket:
        names: list[str] = []
        specs: list[TensorSpec] = []
        seen: set[str] = set()
        nbytes = 0
        known = self.layout.specs
        for source_name, tensor in bucket:
            name = self.name_map(source_name)
            spec = known.get(name)
            if spec is None:
                raise WeightSyncError(
                    f"the engine has no weight {name!r} (trainer name {source_name!r})"
                )
            if tensor.shape != spec.shape:
                raise WeightSyncError(
                    f"weight {name!r}: trainer shape {tuple(tensor.shape)} != engine shape "
                    f"{spec.shape}"
                )
            if name in seen:
                raise WeightSyncError(f"weight {name!r} was sent twice in one sync")
            seen.add(name)
            names.append(name)
            specs.append(spec)
            nbytes += tensor.numel() * spec.dtype.itemsize
        positions = self.layout.positions
        return Bucket(
            names=names,
            specs=specs,
            shapes=[torch.Size(spec.shape) for spec in specs],
            nbytes=nbytes,
            positions=[positions[name] for name in names] if positions else [],
        )

    def check_complete(self) -> tuple[int, int]:
        """Every engine weight sent exactly once, or ``WeightSyncError``; the tensors and bytes
        sent. The buckets of the last complete sync, in the same order, pass as they are.
        Sending changes only: every changed weight sent exactly once, and nothing else."""
        if self.changed is not None:
            return self._check_changed(self.changed)
        complete = self.layout.complete
        if len(self.sent) != len(complete) or not all(map(operator.is_, self.sent, complete)):
            sent: set[str] = set()
            for entry in self.sent:
                if not sent.isdisjoint(entry.names):
                    twice = next(name for name in entry.names if name in sent)
                    raise WeightSyncError(f"weight {twice!r} was sent twice in one sync")
                sent.update(entry.names)
            # every name sent was checked to be one of the engine's
            if len(sent) != len(self.layout.specs):
                missing = sorted(set(self.layout.specs) - sent)
                raise WeightSyncError(
                    f"the trainer sent no value for {len(missing)} engine weight(s), e.g. "
                    f"{missing[:5]}: the engine would serve a mix of old and new weights"
                )
            self.layout.complete = list(self.sent)
        return len(self.layout.specs), sum(entry.nbytes for entry in self.sent)

    def _check_changed(self, changed: frozenset[str]) -> tuple[int, int]:
        sent: set[str] = set()
        for entry in self.sent:
            if not sent.isdisjoint(entry.names):
                twice = next(name for name in entry.names if name in sent)
                raise WeightSyncError(f"weight {twice!r} was sent twice in one sync")
            sent.update(entry.names)
        if sent != changed:
            missing, extra = sorted(changed - sent), sorted(sent - changed)
            raise WeightSyncError(
                f"the source's varying weights were not the ones it named: missing {missing[:5]}, "
                f"unexpected {extra[:5]}; the engine would serve a mix of old and new weights"
            )
        return len(sent), sum(entry.nbytes for entry in self.sent)

    def verify_engine(self, engine: RolloutEngine) -> str:
        """Compares what the engine holds with what was sent (sending changes only, with what
        it held of the others); the combined digest of all of it, for the report."""
        self._require_held_digests()
        if self.in_place is None:
            sent = self.sent_digests.resolve()
            if self.held is not None and self.held.digests is not None:
                sent = {**self.held.digests, **sent}
            verify_digests(sent, engine.weights_digest())
            self.verified_digests = sent
            return combine_digests(sent)
        return self._verify_in_place(self.in_place)

    def _require_held_digests(self) -> None:
        """Sending changes only, the digests the weights left in place were verified with, in
        the form this sync compares (digest strings, or an in-place sync's sums)."""
        if self.held is None:
            return
        kind = self.held.sums if self.in_place is not None else self.held.digests
        if kind is None:
            raise WeightSyncError(
                "the engine's loader changed since the last sync (in place or not): the weights "
                "left in place cannot be checked; the engine is left stale"
            )

    def record(self, in_place: bool) -> HeldDigests:
        """The digests of every weight the engine now holds as verified (none unverified)."""
        if not self.verify:
            return None
        return self.verified_sums if in_place else self.verified_digests

    def _verify_in_place(self, load: InPlaceWeightLoader) -> str:
        layout = self.layout
        written = self.sent_sums
        if written is None or written.device.type != "cuda":
            held = load.digest_sums()
            both = torch.stack((torch.zeros_like(held) if written is None else written, held))
            both = both.to("cpu")
            self._fill_unsent(both[0])
            report = layout.report().of(both[0])
        else:
            # The sent sums are final once the copies are: they travel to the host ahead of the
            # engine's digest, and the report is made from them while the device digests.
            both, sent_ready, held_ready = layout.host_sums(written.device)
            both[0].copy_(written, non_blocking=True)
            sent_ready.record()
            both[1].copy_(load.digest_sums(), non_blocking=True)
            # before the event the host waits for: the next sync, on whatever stream, finds
            # the sums zeroed
            layout.zero_sums_ahead()
            held_ready.record()
            sent_ready.synchronize()
            self._fill_unsent(both[0])
            report = layout.report().of(both[0])
            held_ready.synchronize()
        # strings are made only for the report, or to name what differs
        if not torch.equal(both[0], both[1]):
            assert layout.order is not None
            specs = [layout.specs[name] for name in layout.order]
            verify_digests(
                format_digests(layout.order, specs, both[0]),
                format_digests(layout.order, specs, both[1]),
            )
        self.verified_sums = both[0].clone()
        return report

    def _fill_unsent(self, sent: torch.Tensor) -> None:
        """Sending changes only: the rows of the weights left in place take the sums they were
        sent with, which the engine's own must still equal."""
        if self.held is None:
            return
        assert self.held.sums is not None
        assert self.changed is not None
        rows = self.layout.unchanged_rows(self.changed)
        sent[rows] = self.held.sums[rows]


@functools.cache
def _lends_storage(loader_type: type) -> bool:
    # A Protocol's runtime check looks its methods up by name, which a loader's class fixes.
    return issubclass(loader_type, InPlaceWeightLoader)


def loads_in_place(load: WeightLoader) -> TypeGuard[InPlaceWeightLoader]:
    """``isinstance(load, InPlaceWeightLoader)``, answered once per loader class: the runtime
    check of a Protocol costs tens of microseconds, every sync."""
    return _lends_storage(type(load))


def verify_digests(sent: Mapping[str, str], held: Mapping[str, str]) -> None:
    """``WeightSyncError`` naming how many weights the engine holds other than sent, and one."""
    wrong = sorted(name for name, digest in sent.items() if held.get(name) != digest)
    if wrong:
        first = wrong[0]
        raise WeightSyncError(
            f"{len(wrong)} weight(s) differ in the engine from what was sent, e.g. {first!r}: "
            f"sent {sent[first]}, engine holds {held.get(first)}; the engine is left stale"
        )
