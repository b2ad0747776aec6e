"""Weight sync implementations (``WeightSync``)."""

from lrft.backends.sync.direct import DEFAULT_BUCKET_BYTES, DirectSync

__all__ = ["DEFAULT_BUCKET_BYTES", "DirectSync"]
