"""A reward computed by an HTTP service: JSON in, JSON out, batched, concurrent, bounded retries
with backoff.

The request and reply follow ``protocol`` (:mod:`lrft.rewards.remote_protocols`): lrft's own
format (``{"samples": [...]}`` in, ``{"scores": [...], "metrics": {...}}`` out) or OpenRLHF's
(``{"query", "prompts", "labels"}`` in, ``{"rewards": [...], "extra_logs": {...}}`` out). A batch
goes in one POST, or in POSTs of at most ``batch_size`` samples, at most ``max_concurrency`` of
them in flight at once; the scores come back in the batch's order whatever order the POSTs finish
in. Failures that may pass
(a connection error, a timeout, HTTP 408, 429 or 5xx) are retried up to ``max_attempts`` tries in
all, waiting ``backoff_s``, then twice as long each time, at most ``max_backoff_s``; each retried
failure is logged once (a warning naming the reward, the attempt and the HTTP status or the
transport error), and the output's per-sample metric ``http_retries`` counts the failed tries
before the answer that scored the sample. Anything else (another status that is not 2xx,
redirects included, or a body that is not the protocol's format) fails at once: sending the same
request again would get the same answer. One failed POST fails the batch (the POSTs not yet sent
are not sent).

Credentials never reach a log or an error: URLs are shown through
:func:`lrft.redaction.redact` (userinfo and token-like query parameters hidden), and the
values of credential headers (``Authorization``, ``X-Api-Key``...) are hidden from any text the
service or httpx sends back.
"""

from __future__ import annotations

import base64
import logging
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from types import MappingProxyType
from typing import Any

import attrs
import httpx

from lrft.api.validators import finite, non_negative, one_of, optional, positive_number
from lrft.redaction import REDACTED, is_secret_name, redact
from lrft.rewards._checks import name_validator
from lrft.rewards.base import RewardError, RewardOutput, RewardSample
from lrft.rewards.remote_protocols import PROTOCOLS, RETRIES_METRIC, Malformed
from lrft.rewards.retry import DEFAULT_BACKOFF_S, DEFAULT_MAX_BACKOFF_S, retry_backoff_s

__all__ = ["RETRIES_METRIC", "RemoteReward"]

logger = logging.getLogger(__name__)

_RETRIED_STATUSES = frozenset({408, 429})


def _check_url(_: Any, attribute: attrs.Attribute[Any], value: str) -> None:
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(
            f"{attribute.name} must be an http:// or https:// URL, got {redact(value)!r}"
        )


def _headers(value: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType({str(k): str(v) for k, v in value.items()})


class _RedactRecords(logging.Filter):
    """Hides URL credentials in httpx's own log lines: httpx (0.28) logs every request's full
    URL at INFO on its ``httpx`` logger, userinfo and query included."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact(record.getMessage())
        record.args = None
        return True


_HTTPX_FILTER = _RedactRecords()


def _url_repr(url: str) -> str:
    return repr(redact(url))


def _headers_repr(headers: Mapping[str, str]) -> str:
    shown = {name: REDACTED if is_secret_name(name) else value for name, value in headers.items()}
    return repr(shown)


@attrs.frozen(kw_only=True, eq=False)
class RemoteReward:
    """Scores a batch with POSTs of JSON to ``url`` in ``protocol``'s format (``lrft`` or
    ``openrlhf``), ``batch_size`` samples each (unset: one POST), ``max_concurrency`` at once
    (see the module).

    ``timeout_s`` bounds each of connecting, sending, waiting for bytes of the answer and
    waiting for a pooled connection. After the last failed try, :class:`RewardError` names the
    URL (redacted), the number of tries and the last failure. A sample whose metadata cannot be
    sent as JSON raises :class:`RewardError` naming its index. ``headers`` go with every POST
    (an ``Authorization`` header, say); the values of those whose names look like credentials
    are never shown, in ``repr`` or in errors. ``trust_env`` lets proxy settings from the
    environment apply (httpx's default). The connection pool is closed by :meth:`close`.
    """

    url: str = attrs.field(validator=_check_url, repr=_url_repr)
    timeout_s: float = attrs.field(default=30.0, validator=[finite, positive_number])
    max_attempts: int = attrs.field(default=3, validator=positive_number)
    backoff_s: float = attrs.field(default=DEFAULT_BACKOFF_S, validator=[finite, non_negative])
    max_backoff_s: float = attrs.field(
        default=DEFAULT_MAX_BACKOFF_S, validator=[finite, non_negative]
    )
    headers: Mapping[str, str] = attrs.field(factory=dict, converter=_headers, repr=_headers_repr)
    trust_env: bool = True
    name: str = attrs.field(default="remote", validator=name_validator)
    protocol: str = attrs.field(default="lrft", validator=one_of(*PROTOCOLS))
    batch_size: int | None = attrs.field(default=None, validator=optional(positive_number))
    """The most samples one POST carries (``None``: the whole batch in one)."""
    max_concurrency: int = attrs.field(default=1, validator=positive_number)
    """The most POSTs of one batch in flight at once."""
    _client: httpx.Client = attrs.field(
        init=False,
        repr=False,
        default=attrs.Factory(
            lambda self: httpx.Client(
                timeout=httpx.Timeout(self.timeout_s),
                headers=dict(self.headers),
                trust_env=self.trust_env,
            ),
            takes_self=True,
        ),
    )

    def __attrs_post_init__(self) -> None:
        httpx_logger = logging.getLogger("httpx")
        if _HTTPX_FILTER not in httpx_logger.filters:
            httpx_logger.addFilter(_HTTPX_FILTER)

    def backoff(self, failed_attempts: int) -> float:
        """Seconds to wait after ``failed_attempts`` failed tries before the next one."""
        return retry_backoff_s(failed_attempts, self.backoff_s, self.max_backoff_s)

    @property
    def secrets(self) -> tuple[str, ...]:
        """What is hidden from every message besides URLs: the values of the credential headers,
        and the URL's own credentials (its password, the basic-auth header httpx makes of its
        userinfo, the values of its token-like parameters) in case the service echoes them."""
        found = [value for name, value in self.headers.items() if is_secret_name(name)]
        parts = urllib.parse.urlsplit(self.url)
        if parts.password:
            found.append(urllib.parse.unquote(parts.password))
            pair = f"{urllib.parse.unquote(parts.username or '')}:{found[-1]}"
            found.append(base64.b64encode(pair.encode()).decode())
        for text in (parts.query, parts.fragment):
            found += [v for k, v in urllib.parse.parse_qsl(text) if is_secret_name(k) and v]
        return tuple(found)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> RemoteReward:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __call__(self, samples: Sequence[RewardSample]) -> RewardOutput:
        if not samples:
            return RewardOutput(scores=[])
        wire = PROTOCOLS[self.protocol]
        size = self.batch_size or len(samples)
        starts = range(0, len(samples), size)
        # Every POST's body is made first: a sample that cannot be sent fails before any POST.
        bodies = [
            (
                wire.encode(samples[i : i + size], reward=self.name, first=i),
                len(samples[i : i + size]),
            )
            for i in starts
        ]
        if self.max_concurrency == 1 or len(bodies) == 1:
            outputs = [self._post(body, count) for body, count in bodies]
        else:
            outputs = self._concurrently(bodies)
        return self._joined(outputs)

    def _concurrently(self, bodies: list[tuple[bytes, int]]) -> list[RewardOutput]:
        # httpx's Client may be shared by threads: its connection pool locks.
        workers = min(self.max_concurrency, len(bodies))
        with ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix=f"lrft-{self.name}"
        ) as pool:
            futures: list[Future[RewardOutput]] = [
                pool.submit(self._post, body, count) for body, count in bodies
            ]
            try:
                return [future.result() for future in futures]
            except BaseException:
                for future in futures:
                    future.cancel()  # the POSTs not yet sent are not sent
                raise

    def _joined(self, outputs: list[RewardOutput]) -> RewardOutput:
        names = set(outputs[0].metrics)
        if any(set(output.metrics) != names for output in outputs):
            raise RewardError(
                reward=self.name,
                detail="the service answered the batch's POSTs with different metrics: "
                f"{sorted({name for output in outputs for name in output.metrics})}",
            )
        return RewardOutput(
            scores=[score for output in outputs for score in output.scores],
            metrics={
                name: [value for output in outputs for value in output.metrics[name]]
                for name in outputs[0].metrics
            },
        )

    def _post(self, body: bytes, count: int) -> RewardOutput:
        """One POST of ``count`` samples, retried as the module docstring says."""
        last_failure = ""
        for attempt in range(1, self.max_attempts + 1):
            if attempt > 1:
                time.sleep(self.backoff(attempt - 1))
            try:
                response = self._client.post(
                    self.url, content=body, headers={"content-type": "application/json"}
                )
            except httpx.TransportError as error:
                last_failure = f"{type(error).__name__}: {error}"
                self._log_retry(attempt, type(error).__name__)
                continue
            if response.status_code in _RETRIED_STATUSES or response.status_code >= 500:
                last_failure = f"HTTP {response.status_code}: {response.text[:200]!r}"
                self._log_retry(attempt, f"HTTP {response.status_code}")
                continue
            if not response.is_success:
                raise self._error(
                    f"HTTP {response.status_code}, not retried: {response.text[:200]!r}", attempt
                )
            try:
                output = PROTOCOLS[self.protocol].parse(response.json(), count)
            except (ValueError, Malformed) as error:
                # json.JSONDecodeError is a ValueError; a wrong body would come back the same.
                raise self._error(f"malformed reply, not retried: {error}", attempt) from error
            retries = [float(attempt - 1)] * count
            return RewardOutput(
                scores=output.scores, metrics={**output.metrics, RETRIES_METRIC: retries}
            )
        raise self._error(f"last failure: {last_failure}", self.max_attempts)

    def _log_retry(self, attempt: int, failure: str) -> None:
        if attempt == self.max_attempts:
            return  # the last failure is the error's, not a retry's
        logger.warning(
            "reward %r: POST %s: attempt %d of %d failed (%s); retrying in %.2g s",
            self.name,
            redact(self.url),
            attempt,
            self.max_attempts,
            failure,
            self.backoff(attempt),
        )

    def _error(self, detail: str, attempts: int) -> RewardError:
        tries = "1 attempt" if attempts == 1 else f"{attempts} attempts"
        return RewardError(
            reward=self.name,
            detail=redact(f"POST {self.url} failed after {tries}: {detail}", secrets=self.secrets),
        )
