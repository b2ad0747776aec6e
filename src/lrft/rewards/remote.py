"""A reward computed by an HTTP service: JSON in, JSON out, bounded retries with backoff.

Wire format (one POST per batch)::

    request:  {"samples": [{"prompt": str, "response": str, "label": str,
                            "reference": str | null, "metadata": {...}}, ...]}
    response: {"scores": [float, ...], "metrics": {"name": [float, ...], ...}}

``scores`` has one number per sample, in order; ``metrics`` is optional. Failures that may pass
(a connection error, a timeout, HTTP 408, 429 or 5xx) are retried up to ``max_attempts`` tries in
all, waiting ``backoff_s``, then twice as long each time, at most ``max_backoff_s``; each retried
failure is logged once (a warning naming the reward, the attempt and the HTTP status or the
transport error), and the output's per-sample metric ``http_retries`` counts the failed tries
before the answer that scored the sample. Anything else (another status that is not 2xx,
redirects included, or a body that is not the format above) fails at once: sending the same
request again would get the same answer.

Credentials never reach a log or an error: URLs are shown through
:func:`lrft.api.redaction.redact` (userinfo and token-like query parameters hidden), and the
values of credential headers (``Authorization``, ``X-Api-Key``...) are hidden from any text the
service or httpx sends back.
"""

from __future__ import annotations

import base64
import json
import logging
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import attrs
import httpx

from lrft.api.redaction import REDACTED, is_secret_name, redact
from lrft.api.validators import finite, non_negative, positive
from lrft.rewards._checks import name_validator
from lrft.rewards.base import RewardError, RewardOutput, RewardSample
from lrft.rewards.retry import DEFAULT_BACKOFF_S, DEFAULT_MAX_BACKOFF_S, retry_backoff_s

logger = logging.getLogger(__name__)

_RETRIED_STATUSES = frozenset({408, 429})

RETRIES_METRIC = "http_retries"
"""The per-sample metric counting the failed tries before the answer that scored the sample."""


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


def _wire(sample: RewardSample) -> dict[str, Any]:
    return {
        "prompt": sample.prompt,
        "response": sample.response,
        "label": sample.label,
        "reference": sample.reference,
        "metadata": dict(sample.metadata),
    }


class _Malformed(Exception):
    """The service answered, but not in the wire format."""


def _number_list(value: Any, what: str, count: int) -> list[float]:
    if not isinstance(value, list) or len(value) != count:
        size = len(value) if isinstance(value, list) else type(value).__name__
        raise _Malformed(f"{what} must be a list of {count} numbers, got {size}")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int | float):
            raise _Malformed(f"{what} must hold numbers, got {item!r}")
    return [float(item) for item in value]


def _parse_reply(body: Any, count: int) -> RewardOutput:
    if not isinstance(body, dict) or "scores" not in body:
        raise _Malformed("the body must be a JSON object with a 'scores' list")
    scores = _number_list(body["scores"], "'scores'", count)
    raw_metrics = body.get("metrics", {})
    if not isinstance(raw_metrics, dict):
        raise _Malformed("'metrics' must be a JSON object of lists")
    if RETRIES_METRIC in raw_metrics:
        raise _Malformed(f"metric {RETRIES_METRIC!r} is the client's own count of retried POSTs")
    metrics = {
        str(name): _number_list(values, f"metric {name!r}", count)
        for name, values in raw_metrics.items()
    }
    return RewardOutput(scores=scores, metrics=metrics)


@attrs.frozen(kw_only=True, eq=False)
class RemoteReward:
    """Scores a batch with one POST of JSON to ``url`` (see the module for the format).

    ``timeout_s`` bounds each of connecting, sending, waiting for bytes of the answer and
    waiting for a pooled connection. After the last failed try, :class:`RewardError` names the
    URL (redacted), the number of tries and the last failure. A sample whose metadata cannot be
    sent as JSON raises :class:`RewardError` naming its index. ``headers`` go with every POST
    (an ``Authorization`` header, say); the values of those whose names look like credentials
    are never shown, in ``repr`` or in errors. ``trust_env`` lets proxy settings from the
    environment apply (httpx's default). The connection pool is closed by :meth:`close`.
    """

    url: str = attrs.field(validator=_check_url, repr=_url_repr)
    timeout_s: float = attrs.field(default=30.0, validator=[finite, positive])
    max_attempts: int = attrs.field(default=3, validator=positive)
    backoff_s: float = attrs.field(default=DEFAULT_BACKOFF_S, validator=[finite, non_negative])
    max_backoff_s: float = attrs.field(
        default=DEFAULT_MAX_BACKOFF_S, validator=[finite, non_negative]
    )
    headers: Mapping[str, str] = attrs.field(factory=dict, converter=_headers, repr=_headers_repr)
    trust_env: bool = True
    name: str = attrs.field(default="remote", validator=name_validator)
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
        body = self._encode(samples)
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
                output = _parse_reply(response.json(), len(samples))
            except (ValueError, _Malformed) as error:
                # json.JSONDecodeError is a ValueError; a wrong body would come back the same.
                raise self._error(f"malformed reply, not retried: {error}", attempt) from error
            retries = [float(attempt - 1)] * len(samples)
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

    def _encode(self, samples: Sequence[RewardSample]) -> bytes:
        encoded = []
        for index, sample in enumerate(samples):
            try:
                encoded.append(json.dumps(_wire(sample), allow_nan=False))
            except (TypeError, ValueError) as error:
                raise RewardError(
                    reward=self.name,
                    sample_index=index,
                    detail=f"the sample cannot be sent as JSON: {error}",
                ) from error
        return ('{"samples": [' + ", ".join(encoded) + "]}").encode()
