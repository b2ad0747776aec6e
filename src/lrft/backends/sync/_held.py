"""What a ``DirectSync`` knows its engine holds after its last successful sync: which engine,
the version it set, the source's mark then, and the digests of every weight as verified (so that
a sync that sends only the changed weights can check the ones it leaves in place)."""

from __future__ import annotations

import weakref
from typing import Any

import attrs
import torch

from lrft.api.protocols import RolloutEngine
from lrft.api.types import WeightsMark

HeldDigests = dict[str, str] | torch.Tensor | None
"""Digest strings by engine name, or an in-place sync's sums in the engine's digest order."""


@attrs.frozen(kw_only=True)
class Held:
    """The engine's weights as the last sync left them: the source's varying names then, and
    the digests of every weight (``digests`` or ``sums``, as that sync verified them)."""

    varying: frozenset[str]
    digests: dict[str, str] | None = None
    sums: torch.Tensor | None = None


@attrs.define
class HeldSlot:
    """The record of the last successful sync (cleared when a sync starts)."""

    _engine: weakref.ref[Any] | None = None
    _version: int | None = None
    _mark: WeightsMark | None = None
    _digests: HeldDigests = None
    _verified: bool = False
    _in_place: bool = False

    def mark_for(
        self, engine: RolloutEngine, *, verified: bool, in_place: bool
    ) -> WeightsMark | None:
        """The mark of what ``engine`` holds, if it still holds, whole, what the last sync
        loaded (same engine, still at that version, and digests of the kind this sync needs)."""
        if self._engine is None or self._engine() is not engine or self._mark is None:
            return None
        if engine.weights_version is None or engine.weights_version != self._version:
            return None  # released (sleep level 2), failed, or loaded from elsewhere since
        if verified and (not self._verified or self._in_place != in_place):
            return None
        return self._mark

    def take(self) -> Held:
        assert self._mark is not None
        digests, sums = None, None
        if isinstance(self._digests, torch.Tensor):
            sums = self._digests
        elif self._digests is not None:
            digests = self._digests
        return Held(varying=self._mark.varying, digests=digests, sums=sums)

    def clear(self) -> None:
        self._engine, self._version, self._mark, self._digests = None, None, None, None

    def record(
        self, engine: RolloutEngine, version: int, mark: WeightsMark, digests: HeldDigests
    ) -> None:
        self._engine = weakref.ref(engine)
        self._version = version
        self._mark = mark
        self._digests = digests
        self._verified = digests is not None
        self._in_place = isinstance(digests, torch.Tensor)
