"""``direct`` weight sync: the trainer's full weights loaded into an engine in the same process.

This is the colocated path: every rank gathers the full weights from its training shard
(``full_weights``, collective) and loads them into its own engine, bucket by bucket, so the
largest transient allocation is a bucket or two (the one loading and, for a source that gathers
ahead, the next one), never the model. Each bucket is one call into the
engine (never one call per parameter). Verification compares the engine's digest of what it
stores with the digest of what was sent, after the cast to the dtype the engine declares for each
tensor; the sent digests are computed on the device as the buckets pass and read back once, after
the last bucket, so the stream makes no host round trip per tensor or per bucket. Unverified, each
bucket goes to the engine as gathered and is cast by the engine's copy. Verified, into an engine whose
loader lends its storage (``InPlaceWeightLoader``), each bucket is cast straight into it and
fingerprinted as it is written (``copy_with_digest``, through a ``CopyPlan`` kept per bucket),
and the sums are compared with the engine's on the device; into any other engine, it is first
cast in one fused copy into a buffer laid out for the digest, which then needs no copy of its
own, and the engine copies from there.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import attrs
import torch

from lrft.api import validators as v
from lrft.api.capabilities import SyncCapabilities
from lrft.api.protocols import IncrementalWeightSource, RolloutEngine, WeightSource
from lrft.api.types import EnginePart, SyncReport, WeightsResidency, WeightsUpdate
from lrft.backends.sync._held import HeldSlot
from lrft.backends.sync._layout import MemoSlot
from lrft.backends.sync._stream import Stream, loads_in_place

DEFAULT_BUCKET_BYTES = 256 * 1024 * 1024


def _identity(name: str) -> str:
    return name


@attrs.frozen(kw_only=True)
class DirectSync:
    """Bucketed, cast, name-mapped, verified weight sync into a same-process engine.

    bucket_bytes: upper bound of one gathered bucket (a single larger tensor travels alone).
    verify: compare the engine's per-tensor digest with the sent tensors' (on by default).
    name_map: trainer (Hugging Face) name -> engine name, for engines that rename weights.
    changes_only: from an ``IncrementalWeightSource`` into an engine that still holds what
        this sync loaded last, send only the weights that changed (the varying ones, e.g. a
        LoRA model's adapted modules) when the source says every rank can (see ``WeightSync``).
    """

    bucket_bytes: int = attrs.field(default=DEFAULT_BUCKET_BYTES, validator=v.positive_number)
    verify: bool = True
    name_map: Callable[[str], str] = _identity
    changes_only: bool = True
    # What the checks of the last engine layout found, kept for the next sync: a trainer syncs
    # the same buckets from the same addresses step after step.
    _memo: MemoSlot = attrs.field(factory=lambda: MemoSlot(), init=False, repr=False, eq=False)
    # What the last successful sync left in its engine, for sending only what changed next.
    _held: HeldSlot = attrs.field(factory=lambda: HeldSlot(), init=False, repr=False, eq=False)

    @property
    def capabilities(self) -> SyncCapabilities:
        return SyncCapabilities(
            verifies_digest=self.verify, cross_device=False, sends_changes_only=self.changes_only
        )

    def sync(self, source: WeightSource, engine: RolloutEngine, *, version: int) -> SyncReport:
        """Load ``source``'s current weights into ``engine`` as ``version``; see ``WeightSync``.

        Collective over the source's process group. Errors found mid-stream are raised only
        after the stream is drained, so every rank takes part in every gather and no peer is
        left waiting in a collective.
        """
        start = time.perf_counter()
        specs = engine.parameter_specs()
        update = self._weights_update(source, engine)  # collective, when the source is one
        held = self._held.take() if update is not None and update.varying_only else None
        self._held.clear()  # until this sync succeeds, the engine holds nothing known
        if engine.state.weights is not WeightsResidency.RESIDENT:
            engine.wake([EnginePart.WEIGHTS])
        # Nothing here is differentiated: copies of parameters that require grad would
        # otherwise record autograd history into the engine's weights.
        with torch.no_grad(), engine.weight_update(version) as load:
            in_place = load if self.verify and loads_in_place(load) else None
            layout = self._memo.layout_for(
                specs, in_place.digest_order() if in_place is not None else None
            )
            stream = Stream(
                layout=layout,
                name_map=self.name_map,
                verify=self.verify,
                in_place=in_place,
                held=held,
                changed=None if held is None else frozenset(map(self.name_map, held.varying)),
            )
            # Sources that communicate to gather may then cast first and move fewer bytes.
            if held is not None:
                assert isinstance(source, IncrementalWeightSource)
                buckets = source.varying_weights(
                    self.bucket_bytes, gather_dtype=layout.gather_dtype
                )
            else:
                buckets = source.full_weights(self.bucket_bytes, gather_dtype=layout.gather_dtype)
            stream.run(buckets, load)
            tensors, nbytes = stream.check_complete()
            digest = stream.verify_engine(engine) if self.verify else ""
        if update is not None:
            self._held.record(engine, version, update.mark, stream.record(in_place is not None))
        return SyncReport(
            version=version,
            tensors=tensors,
            bytes=nbytes,
            buckets=stream.buckets,
            seconds=time.perf_counter() - start,
            verified=self.verify,
            digest=digest,
            unchanged=len(specs) - tensors if held is not None else 0,
        )

    def _weights_update(self, source: WeightSource, engine: RolloutEngine) -> WeightsUpdate | None:
        """The source's mark and whether only its varying weights need sending (collective
        over the source's group); ``None`` for a source that cannot tell, or when off."""
        if not self.changes_only or not _tells_changes(type(source)):
            return None
        assert isinstance(source, IncrementalWeightSource)
        in_place = self.verify and "loads_in_place" in engine.capabilities.names()
        return source.weights_mark(
            self._held.mark_for(engine, verified=self.verify, in_place=in_place)
        )


@functools.cache
def _tells_changes(source_type: type) -> bool:
    """``isinstance(source, IncrementalWeightSource)``, answered once per source class."""
    return issubclass(source_type, IncrementalWeightSource)
