"""``ExampleSync``: a ``WeightSync`` that delegates to lrft's direct sync."""

from __future__ import annotations

from lrft.api import RolloutEngine, SyncCapabilities, SyncReport, WeightSource, WeightSyncSpec
from lrft.backends.sync import DirectSync


class ExampleSync:
    """Bucketed, cast, digest-verified loads into a same-process engine, by ``DirectSync``."""

    def __init__(self, *, bucket_bytes: int, verify: bool = True) -> None:
        self._inner = DirectSync(bucket_bytes=bucket_bytes, verify=verify)

    @classmethod
    def from_spec(cls, spec: WeightSyncSpec) -> ExampleSync:
        """How ``lrft train --weight_sync example`` builds it (lrft.api.plugins)."""
        return cls(bucket_bytes=spec.bucket_bytes, verify=spec.verify)

    @property
    def capabilities(self) -> SyncCapabilities:
        return self._inner.capabilities

    def sync(self, source: WeightSource, engine: RolloutEngine, *, version: int) -> SyncReport:
        return self._inner.sync(source, engine, version=version)
