"""Weight sync implementations (``WeightSync``): ``direct`` into an engine of the same process,
``broadcast`` to engines on the rollout ranks of a split placement."""

from lrft.backends.sync.broadcast import BroadcastSync
from lrft.backends.sync.direct import DEFAULT_BUCKET_BYTES, DirectSync

__all__ = ["DEFAULT_BUCKET_BYTES", "BroadcastSync", "DirectSync"]
