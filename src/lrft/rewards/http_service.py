"""One JSON-over-HTTP service, called with the rules every lrft client of a remote service
follows (reward services, :mod:`lrft.rewards.remote`; teacher services,
:mod:`lrft.distill.remote`).

A POST that fails in a way that may pass (a connection error, a timeout, HTTP 408, 429 or 5xx)
is retried up to ``max_attempts`` tries in all, waiting ``backoff_s``, then twice as long each
time, at most ``max_backoff_s``; each retried failure is logged once (a warning naming the
service, the attempt and the HTTP status or the transport error). Anything else (another status
that is not 2xx, redirects included, or a body the caller's parser refuses) fails at once:
sending the same request again would get the same answer.

Credentials never reach a log or an error: URLs are shown through :func:`lrft.redaction.redact`
(userinfo and token-like query parameters hidden), and the values of credential headers
(``Authorization``, ``X-Api-Key``...) are hidden from any text the service or httpx sends back.
"""

from __future__ import annotations

import base64
import logging
import time
import urllib.parse
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Self, TypeVar

import attrs
import httpx

from lrft.api.validators import finite, non_negative, positive_number
from lrft.redaction import REDACTED, is_secret_name, redact
from lrft.rewards.remote_protocols import Malformed
from lrft.rewards.retry import DEFAULT_BACKOFF_S, DEFAULT_MAX_BACKOFF_S, retry_backoff_s

T = TypeVar("T")

_RETRIED_STATUSES = frozenset({408, 429})


def check_url(_: Any, attribute: attrs.Attribute[Any], value: str) -> None:
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(
            f"{attribute.name} must be an http:// or https:// URL, got {redact(value)!r}"
        )


def frozen_headers(value: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType({str(k): str(v) for k, v in value.items()})


class _RedactRecords(logging.Filter):
    """Hides URL credentials in httpx's own log lines: httpx (0.28) logs every request's full
    URL at INFO on its ``httpx`` logger, userinfo and query included."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact(record.getMessage())
        record.args = None
        return True


_HTTPX_FILTER = _RedactRecords()


def url_repr(url: str) -> str:
    return repr(redact(url))


def headers_repr(headers: Mapping[str, str]) -> str:
    shown = {name: REDACTED if is_secret_name(name) else value for name, value in headers.items()}
    return repr(shown)


class ServiceError(Exception):
    """A POST failed for good; ``detail`` says how, with every secret already hidden."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


@attrs.frozen(kw_only=True, eq=False)
class ServiceSettings:
    """Where a service is and how it is called, shared by every client of one (a reward, a
    teacher): ``timeout_s`` bounds each of connecting, sending, waiting for bytes of the answer
    and waiting for a pooled connection; failures that may pass are tried ``max_attempts``
    times in all, ``backoff_s`` apart, twice as long each time, at most ``max_backoff_s``;
    ``headers`` go with every POST (their credential values are never shown, in ``repr`` or in
    errors); ``trust_env`` lets proxy settings from the environment apply (httpx's default)."""

    url: str = attrs.field(validator=check_url, repr=url_repr)
    timeout_s: float = attrs.field(default=30.0, validator=[finite, positive_number])
    max_attempts: int = attrs.field(default=3, validator=positive_number)
    backoff_s: float = attrs.field(default=DEFAULT_BACKOFF_S, validator=[finite, non_negative])
    max_backoff_s: float = attrs.field(
        default=DEFAULT_MAX_BACKOFF_S, validator=[finite, non_negative]
    )
    headers: Mapping[str, str] = attrs.field(
        factory=dict, converter=frozen_headers, repr=headers_repr
    )
    trust_env: bool = True

    def json_service(self, *, kind: str, name: str, log: logging.Logger) -> JsonService:
        """A :class:`JsonService` calling with these settings; its retry warnings say ``kind``
        and ``name`` and go to ``log``."""
        settings = {
            field.name: getattr(self, field.name) for field in attrs.fields(ServiceSettings)
        }
        return JsonService(**settings, kind=kind, name=name, log=log)


@attrs.frozen(kw_only=True, eq=False)
class JsonService(ServiceSettings):
    """POSTs of JSON to ``url`` under the module's rules. ``kind`` and ``name`` word the retry
    warnings (``reward 'judge': POST ...``), which go to ``log``. httpx's Client may be shared
    by threads (its connection pool locks). The connection pool is closed by :meth:`close`."""

    kind: str = "service"
    name: str = "remote"
    log: logging.Logger = attrs.field(factory=lambda: logging.getLogger(__name__), repr=False)
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

    def post(self, body: bytes, parse: Callable[[Any], T]) -> tuple[T, int]:
        """``parse`` of the JSON answer to one POST of ``body``, and the tries it took.
        ``parse`` raises :class:`Malformed` (or ``ValueError``) for a body of the wrong form.
        Raises :class:`ServiceError` after the last failed try, or at once for a failure a
        retry would repeat."""
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
                return parse(response.json()), attempt
            except (ValueError, Malformed) as error:
                # json.JSONDecodeError is a ValueError; a wrong body would come back the same.
                raise self._error(f"malformed reply, not retried: {error}", attempt) from error
        raise self._error(f"last failure: {last_failure}", self.max_attempts)

    def _log_retry(self, attempt: int, failure: str) -> None:
        if attempt == self.max_attempts:
            return  # the last failure is the error's, not a retry's
        self.log.warning(
            "%s %r: POST %s: attempt %d of %d failed (%s); retrying in %.2g s",
            self.kind,
            self.name,
            redact(self.url),
            attempt,
            self.max_attempts,
            failure,
            self.backoff(attempt),
        )

    def _error(self, detail: str, attempts: int) -> ServiceError:
        tries = "1 attempt" if attempts == 1 else f"{attempts} attempts"
        return ServiceError(
            redact(f"POST {self.url} failed after {tries}: {detail}", secrets=self.secrets)
        )


def client_service(kind: str, name: Callable[[Any], str], log: logging.Logger) -> Any:
    """The default of a service client's ``_service`` field (a reward's, a teacher's): an
    ``attrs.Factory`` of the :class:`JsonService` of the client's own
    :class:`ServiceSettings`, whose retry warnings say ``kind`` and ``name(client)`` and go to
    ``log``."""
    return attrs.Factory(
        lambda self: self.json_service(kind=kind, name=name(self), log=log), takes_self=True
    )


class ClosesService:
    """``close`` and the context manager of a client whose :class:`JsonService` is its
    ``_service``: leaving the ``with`` block closes the connection pool."""

    _service: JsonService

    def close(self) -> None:
        self._service.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
