"""Fast fingerprint sums (``lrft.api.digest``) on the device: the machinery the hf engine and
the direct weight sync share. Its sums equal ``lrft.api.digest.digest_sums`` (tested).

A list of tensors costs a fixed number of kernels per group of up to :data:`STAGING_BYTES`,
however many tensors it holds: their bytes are copied (one fused copy) into a buffer of rows of
:data:`ROW_WORDS` words, each tensor starting on a row, and every row is reduced at once
(:func:`digest_sums_many`, :class:`DigestPlan`). The bytes of a row past its tensor's end belong
to no tensor and never count (the CUDA kernel masks them, the eager path zeroes them before
summing), so no buffer is zeroed when it is made. On CUDA the reduction is one Triton kernel that
reads each word once and produces both sums of every row; elsewhere it runs eagerly. Each row's
two sums are then added to its tensor's entry (a row ``q`` rows into its tensor adds
``8192 q * plain_row`` to its weighted sum).

A :class:`DigestBuffer` lays tensors out in those rows from the start, for callers that write the
tensors anyway (an engine's weights, a sync's cast bucket): its sums need no staging copy, and on
CUDA they replay from a CUDA graph (:class:`Replay`) from the second call on.
"""

from lrft.kernels._buffer import DigestBuffer
from lrft.kernels._plan import DigestPlan, digest_sums_many
from lrft.kernels._replay import Replay
from lrft.kernels._rows import ROW_WORDS, STAGING_BYTES, to_device

__all__ = [
    "ROW_WORDS",
    "STAGING_BYTES",
    "DigestBuffer",
    "DigestPlan",
    "Replay",
    "digest_sums_many",
    "to_device",
]
