"""A weight sync registered by a ``--plugins`` module and built by ``lrft train`` from its spec:
lrft's direct sync, counting its syncs and keeping the spec it was built from."""

from __future__ import annotations

from typing import ClassVar

from lrft.api import RolloutEngine, SyncCapabilities, SyncReport, WeightSource, WeightSyncSpec
from lrft.backends import registry
from lrft.backends.sync import DirectSync


class CountingSync:
    """``DirectSync`` that counts the syncs it made (all instances, this process)."""

    syncs: ClassVar[list[int]] = []

    def __init__(self, spec: WeightSyncSpec) -> None:
        self.spec = spec
        self._inner = DirectSync(bucket_bytes=spec.bucket_bytes, verify=spec.verify)

    @classmethod
    def from_spec(cls, spec: WeightSyncSpec) -> CountingSync:
        return cls(spec)

    @property
    def capabilities(self) -> SyncCapabilities:
        return self._inner.capabilities

    def sync(self, source: WeightSource, engine: RolloutEngine, *, version: int) -> SyncReport:
        CountingSync.syncs.append(version)
        return self._inner.sync(source, engine, version=version)


class NotASync:
    """Registered as a sync, but from_spec builds something that is not one."""

    @classmethod
    def from_spec(cls, spec: WeightSyncSpec) -> NotASync:
        return cls()


registry.register("sync", "counting", "tests.unit._plugins.backends:CountingSync")
registry.register("sync", "not-a-sync", "tests.unit._plugins.backends:NotASync")
