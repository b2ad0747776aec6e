"""``broadcast`` weight sync: the trainer's full weights sent to engines on other ranks.

The split placement (:class:`lrft.dist.SplitLayout`) trains on some ranks and generates on the
others. Every trainer rank takes part in gathering the full weights, bucket by bucket, from its
shard (``full_weights``, collective over the trainer group, as for ``direct``); the sender (the
trainer's rank 0) casts each bucket to the dtypes the engine stores, fingerprints it, and
broadcasts it over the span group (gloo on CPU, NCCL on CUDA: the trainer and the engines need
not share a device or a process). Every rollout rank writes each bucket through its engine's
``weight_update`` stream, so the largest transient allocation is a bucket, never the model.
After the last bucket each rollout rank checks that every weight came, compares its engine's
``weights_digest`` with the digests the sender computed, and reports the version its engine
serves; the sender checks every report, and every trainer rank raises ``WeightSyncError`` if
any rollout rank failed or serves another version. A rollout rank that fails leaves its engine
stale, never serving a mix of versions as if it were current.

A LoRA source sends its merged weights (``full_weights`` merges them), vision and audio towers go
like any other weights, and every sync sends every weight (no ``sends_changes_only``).

Generation and syncs on one engine exclude each other through :meth:`BroadcastSync.serving`: a
rollout rank that generates while weights may arrive (another thread of its own) holds it
around each generation, and a sync waits for it before it writes the first weight.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import attrs
import torch

from lrft.api.capabilities import SyncCapabilities
from lrft.api.digest import combine_digests, tensor_digests
from lrft.api.errors import WeightSyncError
from lrft.api.protocols import RolloutEngine, WeightLoader, WeightSource
from lrft.api.types import EnginePart, SyncReport, TensorSpec, WeightsResidency
from lrft.backends.sync._broadcast_wire import BucketHeader, Received, StreamEnd, pack, unpack
from lrft.backends.sync._stream import verify_digests
from lrft.backends.sync.direct import DEFAULT_BUCKET_BYTES
from lrft.dist.collectives import broadcast_object
from lrft.dist.span import SpanGroup
from lrft.dist.split import SENDER, SplitGroups

Bucket = list[tuple[str, torch.Tensor]]


def _positive(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value!r}")


@attrs.define
class _Known:
    """What the first sync learns and later ones reuse: the engine's weights (on the span
    members) and the dtype the trainer gathers in (on every trainer rank)."""

    specs: dict[str, TensorSpec] | None = None
    gather_dtype: torch.dtype | None = None
    gather_dtype_known: bool = False


@attrs.define
class _Taken:
    """What a rollout rank took of one stream, and the digests its engine then held."""

    names: set[str] = attrs.field(factory=set)
    nbytes: int = 0
    buckets: int = 0
    held: dict[str, str] | None = None


@attrs.frozen(kw_only=True)
class _Outcome:
    """The sender's verdict on a sync, handed to every trainer rank."""

    report: SyncReport | None
    error: str | None


@attrs.frozen(kw_only=True)
class BroadcastSync:
    """Bucketed, cast, verified, versioned weight sync from the trainer ranks of a split
    placement to every rollout rank; see the module docstring.

    ``sync(source, engine, version=v)`` is collective over the whole job: trainer ranks pass
    their ``source`` (and no engine), rollout ranks their ``engine`` (and no source).
    bucket_bytes: upper bound of one gathered bucket (a single larger tensor travels alone).
    verify: compare every engine's digest with the digests of what was sent (on by default).
    """

    groups: SplitGroups
    bucket_bytes: int = attrs.field(default=DEFAULT_BUCKET_BYTES, validator=_positive)
    verify: bool = True
    _known: _Known = attrs.field(factory=_Known, init=False, repr=False, eq=False)
    _writing: threading.Lock = attrs.field(factory=threading.Lock, init=False, repr=False, eq=False)

    @property
    def capabilities(self) -> SyncCapabilities:
        return SyncCapabilities(verifies_digest=self.verify, cross_device=True)

    @contextmanager
    def serving(self, engine: RolloutEngine) -> Iterator[None]:
        """Hold around a generation on ``engine``: a sync into it waits until the block ends
        before it writes any weight, and the block waits for a sync in progress."""
        with self._writing:
            yield

    def sync(
        self, source: WeightSource | None, engine: RolloutEngine | None, *, version: int
    ) -> SyncReport:
        """Send (trainer ranks) or receive (rollout ranks) the weights as ``version``."""
        where = self.groups.layout.describe(self.groups.rank)
        if self.groups.role == "train":
            if source is None:
                raise ValueError(f"{where} sends weights: sync needs its source")
            return self._send(source, version)
        if engine is None:
            raise ValueError(f"{where} receives weights: sync needs its engine")
        return self._receive(engine, version)

    # --- the trainer side ---------------------------------------------------------------------

    def _send(self, source: WeightSource, version: int) -> SyncReport:
        start = time.perf_counter()
        span = self.groups.weights
        specs = self._engine_specs(None) if span is not None else {}
        gather_dtype = self._gather_dtype(specs)
        outcome = None
        buckets = source.full_weights(self.bucket_bytes, gather_dtype=gather_dtype)
        if span is None:
            for _ in buckets:
                pass  # the sender's peers gather every bucket with it
        else:
            outcome = self._stream(span, buckets, specs, version, start)
        if self.groups.layout.train_world_size > 1:
            outcome = broadcast_object(outcome, src=SENDER)
        assert outcome is not None
        if outcome.error is not None:
            raise WeightSyncError(outcome.error)
        assert outcome.report is not None
        return outcome.report

    def _gather_dtype(self, specs: dict[str, TensorSpec]) -> torch.dtype | None:
        """The one dtype the engine stores its floating-point weights in, if it has one: the
        trainer ranks may gather in it and move fewer bytes. Agreed on every trainer rank."""
        known = self._known
        if not known.gather_dtype_known:
            stored = {spec.dtype for spec in specs.values() if spec.dtype.is_floating_point}
            mine = next(iter(stored)) if len(stored) == 1 else None
            if self.groups.layout.train_world_size > 1:
                mine = broadcast_object((mine,), src=SENDER)[0]
            known.gather_dtype, known.gather_dtype_known = mine, True
        return known.gather_dtype

    def _stream(
        self,
        span: SpanGroup,
        buckets: Iterator[Bucket],
        specs: dict[str, TensorSpec],
        version: int,
        start: float,
    ) -> _Outcome:
        error: str | None = None
        sent: dict[str, str] = {}
        names: set[str] = set()
        count = nbytes = 0
        for bucket in buckets:
            if error is not None:
                continue  # drain: the other trainer ranks gather the rest with this one
            try:
                cast = self._cast(bucket, specs, names)
            except WeightSyncError as failed:
                error = str(failed)
                continue
            header, buffer = pack([name for name, _ in cast], [t for _, t in cast], span.device)
            self._send_bucket(span, header, buffer)
            if self.verify:
                sent.update(tensor_digests(dict(cast)))
            count += 1
            nbytes += sum(t.numel() * t.element_size() for _, t in cast)
        if error is None and names != set(specs):
            missing = sorted(set(specs) - names)
            error = (
                f"the trainer sent no value for {len(missing)} engine weight(s), e.g. "
                f"{missing[:5]}: the engines would serve a mix of old and new weights"
            )
        span.broadcast_object(StreamEnd(digests=sent if self.verify else None, error=error), SENDER)
        reports: list[Received | None] = span.all_gather_objects(None)
        problems = self._problems(reports[1:], version, combine_digests(sent))
        if error is not None or problems:
            reasons = ([f"the sender: {error}"] if error is not None else []) + problems
            return _Outcome(
                report=None,
                error=f"weight sync to version {version} failed: {'; '.join(reasons)}; the "
                "failed engines are left stale",
            )
        report = SyncReport(
            version=version,
            tensors=len(names),
            bytes=nbytes,
            buckets=count,
            seconds=time.perf_counter() - start,
            verified=self.verify,
            digest=combine_digests(sent) if self.verify else "",
        )
        return _Outcome(report=report, error=None)

    def _cast(
        self, bucket: Bucket, specs: dict[str, TensorSpec], names: set[str]
    ) -> list[tuple[str, torch.Tensor]]:
        """The bucket checked against the engine's weights and cast to the dtypes it stores."""
        cast = []
        for name, tensor in bucket:
            spec = specs.get(name)
            if spec is None:
                raise WeightSyncError(f"the engines have no weight {name!r}")
            if tuple(tensor.shape) != spec.shape:
                raise WeightSyncError(
                    f"weight {name!r}: trainer shape {tuple(tensor.shape)} != engine shape "
                    f"{spec.shape}"
                )
            if name in names:
                raise WeightSyncError(f"weight {name!r} was sent twice in one sync")
            names.add(name)
            with torch.no_grad():
                cast.append((name, tensor.detach().to(spec.dtype)))
        return cast

    @staticmethod
    def _send_bucket(span: SpanGroup, header: BucketHeader, buffer: torch.Tensor) -> None:
        span.broadcast_object(header, SENDER)
        span.broadcast(buffer, SENDER)

    def _problems(self, reports: list[Received | None], version: int, digest: str) -> list[str]:
        """What is wrong with the rollout ranks' reports, one phrase per rank."""
        layout = self.groups.layout
        problems = []
        for report in reports:
            assert report is not None
            where = layout.describe(report.rank)
            if report.error is not None:
                problems.append(f"{where}: {report.error}")
            elif report.version != version:
                problems.append(
                    f"{where}: its engine serves version {report.version} after a sync "
                    f"labelled {version}"
                )
            elif self.verify and report.digest != digest:
                problems.append(
                    f"{where}: its engine's combined digest {report.digest} is not the sent "
                    f"weights' {digest}"
                )
        return problems

    # --- both sides ---------------------------------------------------------------------------

    def _engine_specs(self, engine: RolloutEngine | None) -> dict[str, TensorSpec]:
        """The engines' weights, from the first rollout rank to every span member (once)."""
        known, span = self._known, self.groups.weights
        if known.specs is None:
            assert span is not None
            first = self.groups.layout.rollout_ranks[0]
            mine = dict(engine.parameter_specs()) if engine is not None else None
            known.specs = span.broadcast_object(mine if self.groups.rank == first else None, first)
        return known.specs

    # --- the rollout side ---------------------------------------------------------------------

    def _receive(self, engine: RolloutEngine, version: int) -> SyncReport:
        start = time.perf_counter()
        span = self.groups.weights
        assert span is not None
        self._engine_specs(engine)
        specs = engine.parameter_specs()
        if engine.state.weights is not WeightsResidency.RESIDENT:
            engine.wake([EnginePart.WEIGHTS])
        failure: WeightSyncError | None = None
        taken = _Taken()
        try:
            # Nothing is differentiated: the engine's copies must record no autograd history.
            with self._writing, torch.no_grad(), engine.weight_update(version) as load:
                self._take_stream(span, engine, specs, load, taken)
        except WeightSyncError as failed:
            failure = failed
        served = engine.weights_version
        digest = "" if taken.held is None or failure is not None else combine_digests(taken.held)
        span.all_gather_objects(
            Received(
                rank=self.groups.rank,
                version=served,
                digest=digest,
                error=None if failure is None else str(failure),
            )
        )
        if failure is not None:
            raise failure
        assert served is not None
        return SyncReport(
            version=served,
            tensors=len(taken.names),
            bytes=taken.nbytes,
            buckets=taken.buckets,
            seconds=time.perf_counter() - start,
            verified=self.verify,
            digest=digest,
        )

    def _take_stream(
        self,
        span: SpanGroup,
        engine: RolloutEngine,
        specs: Mapping[str, TensorSpec],
        load: WeightLoader,
        taken: _Taken,
    ) -> None:
        """Every bucket of the stream loaded through ``load`` (counted in ``taken``), then
        checked complete and verified; raises ``WeightSyncError`` (inside the update: the engine
        is left stale) only after taking the whole stream."""
        error: str | None = None
        while True:
            message: BucketHeader | StreamEnd = span.broadcast_object(None, SENDER)
            if isinstance(message, StreamEnd):
                break
            assert isinstance(message, BucketHeader)
            buffer = torch.empty(message.nbytes, dtype=torch.uint8, device=span.device)
            span.broadcast(buffer, SENDER)
            if error is not None:
                continue  # the rest of the stream is still taken, as the sender sends it
            named = unpack(message, buffer)
            try:
                load(named)
            except Exception as failed:  # raised after the stream, never mid-broadcast
                error = f"loading bucket {taken.buckets} failed: {failed}"
                continue
            taken.names.update(message.names)
            taken.nbytes += sum(t.numel() * t.element_size() for _, t in named)
            taken.buckets += 1
        if message.error is not None:
            raise WeightSyncError(f"the sender failed: {message.error}")
        if error is not None:
            raise WeightSyncError(error)
        missing = sorted(set(specs) - taken.names)
        if missing:
            raise WeightSyncError(
                f"no value arrived for {len(missing)} engine weight(s), e.g. {missing[:5]}"
            )
        if message.digests is not None:
            taken.held = engine.weights_digest()
            verify_digests(message.digests, taken.held)
