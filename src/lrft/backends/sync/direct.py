"""``direct`` weight sync: the trainer's full weights loaded into an engine in the same process.

This is the colocated path: every rank gathers the full weights from its training shard
(``full_weights``, collective) and loads them into its own engine, bucket by bucket, so the
largest transient allocation is a bucket or two (the one loading and, for a source that gathers
ahead, the next one), never the model. Each bucket is one call into the
engine (never one call per parameter). Verification compares the engine's digest of what it
stores with the digest of what was sent, after the cast to the engine's dtype; the sent
digests are computed on the device as the buckets pass and read back once, after the last
bucket, so the stream makes no host round trip per tensor or per bucket. Unverified, each bucket
goes to the engine as gathered and is cast by the engine's copy. Verified, into an engine whose
loader lends its storage (``InPlaceWeightLoader``), each bucket is cast straight into it and
fingerprinted as it is written (``copy_with_digest``, through a ``CopyPlan`` kept per bucket),
and the sums are compared with the engine's on the device; into any other engine, it is first
cast in one fused copy into a buffer laid out for the digest, which then needs no copy of its
own, and the engine copies from there.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Iterable, Mapping

import attrs
import torch

from lrft.api.capabilities import SyncCapabilities
from lrft.api.digest import (
    CombinedDigest,
    CopyPlan,
    DigestBuffer,
    PendingDigests,
    combine_digests,
    format_digests,
)
from lrft.api.errors import WeightSyncError
from lrft.api.protocols import InPlaceWeightLoader, RolloutEngine, WeightLoader, WeightSource
from lrft.api.types import EnginePart, SyncReport, TensorSpec, WeightsResidency

DEFAULT_BUCKET_BYTES = 256 * 1024 * 1024
_MAX_PLANS = 4096


def _positive(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value!r}")


def _identity(name: str) -> str:
    return name


@attrs.frozen(kw_only=True)
class DirectSync:
    """Bucketed, cast, name-mapped, verified weight sync into a same-process engine.

    bucket_bytes: upper bound of one gathered bucket (a single larger tensor travels alone).
    verify: compare the engine's per-tensor digest with the sent tensors' (on by default).
    name_map: trainer (Hugging Face) name -> engine name, for engines that rename weights.
    """

    bucket_bytes: int = attrs.field(default=DEFAULT_BUCKET_BYTES, validator=_positive)
    verify: bool = True
    name_map: Callable[[str], str] = _identity
    # Writing in place, the copy plan of each bucket (by its names), checked before each reuse:
    # a trainer syncs the same buckets from the same addresses step after step.
    _plans: dict[tuple[str, ...], CopyPlan] = attrs.field(
        factory=dict, init=False, repr=False, eq=False
    )
    # and the layout of the report's combined digest, per engine weight order
    _reports: dict[tuple[str, ...], CombinedDigest] = attrs.field(
        factory=dict, init=False, repr=False, eq=False
    )

    @property
    def capabilities(self) -> SyncCapabilities:
        return SyncCapabilities(verifies_digest=self.verify, cross_device=False)

    def sync(self, source: WeightSource, engine: RolloutEngine, *, version: int) -> SyncReport:
        """Load ``source``'s current weights into ``engine`` as ``version``; see ``WeightSync``.

        Collective over the source's process group. Errors found mid-stream are raised only
        after the stream is drained, so every rank takes part in every gather and no peer is
        left waiting in a collective.
        """
        start = time.perf_counter()
        specs = engine.parameter_specs()
        if engine.state.weights is not WeightsResidency.RESIDENT:
            engine.wake([EnginePart.WEIGHTS])
        # Sources that communicate to gather may then cast first and move fewer bytes.
        dtypes = {spec.dtype for spec in specs.values()}
        gather_dtype = dtypes.pop() if len(dtypes) == 1 else None
        with engine.weight_update(version) as load:
            stream = _Stream(
                specs=specs,
                name_map=self.name_map,
                verify=self.verify,
                plans=self._plans,
                reports=self._reports,
            )
            if self.verify and isinstance(load, InPlaceWeightLoader):
                stream.write_in_place(load)
            stream.run(source.full_weights(self.bucket_bytes, gather_dtype=gather_dtype), load)
            stream.check_complete()
            digest = stream.verify_engine(engine) if self.verify else ""
        return SyncReport(
            version=version,
            tensors=len(stream.sent_bytes),
            bytes=sum(stream.sent_bytes.values()),
            buckets=stream.buckets,
            seconds=time.perf_counter() - start,
            verified=self.verify,
            digest=digest,
        )


@attrs.define
class _Stream:
    specs: Mapping[str, TensorSpec]
    name_map: Callable[[str], str]
    verify: bool
    plans: dict[tuple[str, ...], CopyPlan]
    reports: dict[tuple[str, ...], CombinedDigest]
    sent_bytes: dict[str, int] = attrs.field(factory=dict)
    # Queued on the device bucket by bucket and read back once at the end: a host sync per
    # tensor (or per bucket) would stall the stream of gathers and copies.
    sent_digests: PendingDigests = attrs.field(factory=PendingDigests)
    buckets: int = 0
    # Writing in place: the engine's loader, each weight's row in its digest sums, and the sums
    # of what was written there, accumulated on the device.
    in_place: InPlaceWeightLoader | None = None
    positions: dict[str, int] = attrs.field(factory=dict)
    sent_sums: torch.Tensor | None = None

    def write_in_place(self, load: InPlaceWeightLoader) -> None:
        self.in_place = load
        self.positions = {name: i for i, name in enumerate(load.digest_order())}

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
        names, specs, tensors = self._checked(bucket)
        if not tensors:
            return
        if not self.verify:
            # The engine casts while it copies: no intermediate copy of the bucket.
            load(list(zip(names, tensors, strict=True)))
        elif self.in_place is not None:
            # One cast copy straight into the engine's storage; the sent fingerprint is taken
            # from the values as they are written.
            targets = self.in_place.targets(names)
            if self.sent_sums is None:
                self.sent_sums = torch.zeros(
                    (len(self.positions), 2), dtype=torch.int64, device=targets[0].device
                )
            positions = [self.positions[name] for name in names]
            key = tuple(names)
            plan = self.plans.get(key)
            if plan is None or not plan.matches(tensors, targets, positions):
                if len(self.plans) >= _MAX_PLANS:
                    self.plans.clear()  # a source whose buckets never repeat
                plan = self.plans[key] = CopyPlan(tensors, targets, positions, targets[0].device)
            plan.run(tensors, targets, self.sent_sums)
        else:
            # The cast must exist to be fingerprinted, so it is written, in one fused copy,
            # into a buffer laid out for digests; the engine then copies from it.
            cast = DigestBuffer([(spec.shape, spec.dtype) for spec in specs], tensors[0].device)
            torch._foreach_copy_(cast.views, tensors)
            self.sent_digests.add_buffer(names, cast)
            load(list(zip(names, cast.views, strict=True)))

    def _checked(
        self, bucket: list[tuple[str, torch.Tensor]]
    ) -> tuple[list[str], list[TensorSpec], list[torch.Tensor]]:
        names: list[str] = []
        specs: list[TensorSpec] = []
        tensors: list[torch.Tensor] = []
        # Runs once per tensor per sync: kept to dictionary lookups and comparisons.
        rename = None if self.name_map is _identity else self.name_map
        for source_name, tensor in bucket:
            name = source_name if rename is None else rename(source_name)
            spec = self.specs.get(name)
            if spec is None:
                raise WeightSyncError(
                    f"the engine has no weight {name!r} (trainer name {source_name!r})"
                )
            if tensor.shape != spec.shape:
                raise WeightSyncError(
                    f"weight {name!r}: trainer shape {tuple(tensor.shape)} != engine shape "
                    f"{spec.shape}"
                )
            if name in self.sent_bytes:
                raise WeightSyncError(f"weight {name!r} was sent twice in one sync")
            self.sent_bytes[name] = tensor.numel() * spec.dtype.itemsize
            names.append(name)
            specs.append(spec)
            tensors.append(tensor.detach() if tensor.requires_grad else tensor)
        return names, specs, tensors

    def check_complete(self) -> None:
        missing = sorted(set(self.specs) - set(self.sent_bytes))
        if missing:
            raise WeightSyncError(
                f"the trainer sent no value for {len(missing)} engine weight(s), e.g. "
                f"{missing[:5]}: the engine would serve a mix of old and new weights"
            )

    def verify_engine(self, engine: RolloutEngine) -> str:
        """Compares what the engine holds with what was sent; the combined digest of what was
        sent, for the report."""
        if self.in_place is None:
            sent = self.sent_digests.resolve()
            _verify(sent, engine.weights_digest())
            return combine_digests(sent)
        order = self.in_place.digest_order()
        held = self.in_place.digest_sums()
        sent_sums = self.sent_sums if self.sent_sums is not None else torch.zeros_like(held)
        # One comparison on the device and one host sync; strings only for the report, or to
        # name what differs.
        specs = [self.specs[name] for name in order]
        if not torch.equal(sent_sums, held):
            _verify(format_digests(order, specs, sent_sums), format_digests(order, specs, held))
        report = self.reports.get(key := tuple(order))
        if report is None or not all(map(operator.is_, report.specs, specs)):
            report = self.reports[key] = CombinedDigest(order, specs)
        return report.of(sent_sums)


def _verify(sent: Mapping[str, str], held: Mapping[str, str]) -> None:
    wrong = sorted(name for name, digest in sent.items() if held.get(name) != digest)
    if wrong:
        first = wrong[0]
        raise WeightSyncError(
            f"{len(wrong)} weight(s) differ in the engine from what was sent, e.g. {first!r}: "
            f"sent {sent[first]}, engine holds {held.get(first)}; the engine is left stale"
        )
