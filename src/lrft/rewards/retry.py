"""The remote reward's wait between tries, without httpx: the config checks read it too."""

from __future__ import annotations

DEFAULT_BACKOFF_S = 0.5
"""The wait after the first failed try."""
DEFAULT_MAX_BACKOFF_S = 8.0
"""The longest wait between two tries."""


def retry_backoff_s(
    failed_attempts: int,
    backoff_s: float = DEFAULT_BACKOFF_S,
    max_backoff_s: float = DEFAULT_MAX_BACKOFF_S,
) -> float:
    """Seconds to wait after ``failed_attempts`` failed tries before the next one: ``backoff_s``,
    twice as long after each further failure, at most ``max_backoff_s``."""
    return min(max_backoff_s, backoff_s * 2.0 ** (failed_attempts - 1))
