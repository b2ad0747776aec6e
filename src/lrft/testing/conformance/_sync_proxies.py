"""Stand-ins the ``WeightSyncSuite`` puts between a sync and the real engine or source: they
forward everything to the real object and either count what the sync does or inject the fault
a sync must catch (corruption in transit, writes that miss the engine's storage, a broken
gather). All are public so that a backend author can reuse them in checks of their own."""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import ClassVar

import torch

from lrft.api import InPlaceWeightLoader, RolloutEngine, WeightLoader, WeightSource
from lrft.api.protocols import NamedTensors

Bucket = list[tuple[str, torch.Tensor]]

__all__ = [
    "CorruptInTransit",
    "CountsEngineCalls",
    "LoaderProxy",
    "MisdirectInPlace",
    "StreamProbe",
]


class LoaderProxy(abc.ABC):
    """An engine proxy that wraps the loader of every ``weight_update``; everything else is the
    real engine's. ``needs``: the engine capabilities the wrapping relies on."""

    needs: ClassVar[tuple[str, ...]] = ()

    def __init__(self, engine: RolloutEngine) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> object:
        return getattr(self._engine, name)

    @abc.abstractmethod
    def wrap(self, load: WeightLoader) -> WeightLoader: ...

    @contextmanager
    def _update(self, version: int) -> Iterator[WeightLoader]:
        with self._engine.weight_update(version) as load:
            yield self.wrap(load)

    def weight_update(self, version: int) -> AbstractContextManager[WeightLoader]:
        return self._update(version)


class CorruptInTransit(LoaderProxy):
    """Perturbs the first tensor of every loaded batch, as a faulty transport would."""

    def wrap(self, load: WeightLoader) -> WeightLoader:
        def corrupt(named_tensors: NamedTensors) -> None:
            (name, first), *rest = named_tensors
            load([(name, first + 1), *rest])

        return corrupt


class MisdirectInPlace(LoaderProxy):
    """Its in-place loader lends scratch tensors instead of the engine's storage for the first
    lend, as a loader that lent stale storage would: those writes never reach the engine.
    ``lent``: how many times the sync asked for targets (0: it never wrote in place)."""

    needs = ("loads_in_place",)

    def __init__(self, engine: RolloutEngine) -> None:
        super().__init__(engine)
        self.lent = 0

    def wrap(self, load: WeightLoader) -> WeightLoader:
        assert isinstance(load, InPlaceWeightLoader), (
            f"an engine that declares loads_in_place yielded a {type(load).__name__}"
        )
        return _MisdirectingLoader(load, self)


class _MisdirectingLoader:
    def __init__(self, load: InPlaceWeightLoader, proxy: MisdirectInPlace) -> None:
        self._load = load
        self._proxy = proxy

    def __call__(self, named_tensors: NamedTensors) -> None:
        self._load(named_tensors)

    def targets(self, names: Sequence[str]) -> list[torch.Tensor]:
        real = self._load.targets(names)
        self._proxy.lent += 1
        return [torch.empty_like(t) for t in real] if self._proxy.lent == 1 else real

    def digest_order(self) -> Sequence[str]:
        return self._load.digest_order()

    def digest_sums(self) -> torch.Tensor:
        return self._load.digest_sums()


class CountsEngineCalls(LoaderProxy):
    """Counts the calls a sync makes into the engine to load weights: ``load_weights``, each
    call of a ``weight_update`` loader, and each ``targets`` lend of an in-place loader."""

    def __init__(self, engine: RolloutEngine) -> None:
        super().__init__(engine)
        self.calls = 0

    def load_weights(self, named_tensors: NamedTensors, *, version: int) -> None:
        self.calls += 1
        self._engine.load_weights(named_tensors, version=version)

    def wrap(self, load: WeightLoader) -> WeightLoader:
        if isinstance(load, InPlaceWeightLoader):
            return _CountingInPlaceLoader(load, self)
        return _CountingLoader(load, self)


class _CountingLoader:
    def __init__(self, load: WeightLoader, proxy: CountsEngineCalls) -> None:
        self._load = load
        self._proxy = proxy

    def __call__(self, named_tensors: NamedTensors) -> None:
        self._proxy.calls += 1
        self._load(named_tensors)


class _CountingInPlaceLoader(_CountingLoader):
    def __init__(self, load: InPlaceWeightLoader, proxy: CountsEngineCalls) -> None:
        super().__init__(load, proxy)
        self._lender = load

    def targets(self, names: Sequence[str]) -> list[torch.Tensor]:
        self._proxy.calls += 1
        return self._lender.targets(names)

    def digest_order(self) -> Sequence[str]:
        return self._lender.digest_order()

    def digest_sums(self) -> torch.Tensor:
        return self._lender.digest_sums()


class StreamProbe:
    """A weight source that passes ``source``'s stream through, counting the buckets the sync
    takes, optionally with the first tensor misshapen (a broken gather: the rest of the stream
    is intact, so the sync must take it all before failing, since peers gather it with this
    rank). ``rest()`` takes whatever the sync left, so that peers are never left waiting."""

    def __init__(self, source: WeightSource, *, misshapen_head: bool = False) -> None:
        self._source = source
        self._misshapen_head = misshapen_head
        self._buckets: Iterator[Bucket] | None = None
        self.taken = 0

    def full_weights(
        self, bucket_bytes: int, *, gather_dtype: torch.dtype | None = None
    ) -> Iterator[Bucket]:
        self._buckets = self._source.full_weights(bucket_bytes, gather_dtype=gather_dtype)
        self.taken = 0
        return self._stream(self._buckets)

    def _stream(self, buckets: Iterator[Bucket]) -> Iterator[Bucket]:
        # A plain loop, not ``yield from``: a sync that drops this generator must not close the
        # source's stream, which ``rest`` then finishes.
        for bucket in buckets:
            self.taken += 1
            if self._misshapen_head and self.taken == 1:
                (name, tensor), *others = bucket
                bucket = [(name, tensor.reshape(-1)[:-1]), *others]
            yield bucket

    def rest(self) -> int:
        """Take the buckets the sync did not; how many there were."""
        return 0 if self._buckets is None else sum(1 for _ in self._buckets)
