"""What counts as a secret in a URL or a header, and the one function that hides it.

:func:`redact` is what lrft applies to every config it serialises (checkpoint manifests, the
W&B config) and to every message that may carry a URL (reward errors, retry logs, configuration
errors). In a URL it hides the userinfo (``user:password@``) and the values of query or fragment
parameters whose names look like credentials (``token``, ``api_key``, ``sig``, ...); in any text
it also hides the exact strings passed as ``secrets`` (an auth header's value, say). A secret in
a URL's path (a webhook's token segment) cannot be told from a path and is not hidden: give such
services their credential through a header instead.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import TypeVar, cast

T = TypeVar("T")

REDACTED = "***"
"""What a hidden secret is replaced with."""

_SECRET_NAME = re.compile(
    r"token|key|secret|passw|pwd|auth|sig|credential|session|cookie|jwt|bearer", re.IGNORECASE
)
_URL = re.compile(r"[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s'\"<>]+")
# A comma followed by a scheme starts the next URL of a comma-separated list (LightRFT's form
# of --remote_rm_url), which would otherwise read as part of the first URL's path.
_NEXT_URL = re.compile(r",(?=[a-zA-Z][a-zA-Z0-9+.\-]*://)")


def is_secret_name(name: str) -> bool:
    """Whether a query parameter or header called ``name`` holds a credential
    (``access_token``, ``X-Api-Key``, ``Authorization``, ``sig``...)."""
    return _SECRET_NAME.search(name) is not None


def _parameters(text: str) -> str:
    kept = []
    for item in text.split("&"):
        name, equals, _ = item.partition("=")
        secret = is_secret_name(urllib.parse.unquote_plus(name))
        kept.append(f"{name}={REDACTED}" if equals and secret else item)
    return "&".join(kept)


def redact_url(url: str) -> str:
    """``url`` with its userinfo and credential-like parameters replaced by ``***``."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # not even a URL's shape: keep the scheme alone
        return f"{url.partition('://')[0]}://{REDACTED}"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rpartition('@')[2]}"
    return urllib.parse.urlunsplit(
        (parts.scheme, netloc, parts.path, _parameters(parts.query), _parameters(parts.fragment))
    )


def _text(text: str, secrets: tuple[str, ...]) -> str:
    def one_match(match: re.Match[str]) -> str:
        return ",".join(redact_url(piece) for piece in _NEXT_URL.split(match.group(0)))

    hidden = _URL.sub(one_match, text)
    for secret in secrets:
        hidden = hidden.replace(secret, REDACTED)
    return hidden


def redact(value: T, *, secrets: Iterable[str] = ()) -> T:
    """``value`` with every secret hidden: in a string, each URL's credentials (see
    :func:`redact_url`) and each of ``secrets``; in a mapping, list or tuple, the same in every
    value, recursively (a mapping comes back as a ``dict``). Anything else is returned as it is."""
    known = tuple(secret for secret in secrets if secret)
    return cast(T, _redact(value, known))


def _redact(value: object, secrets: tuple[str, ...]) -> object:
    if isinstance(value, str):
        return _text(value, secrets)
    if isinstance(value, Mapping):
        return {key: _redact(item, secrets) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_redact(item, secrets) for item in value)
    return value
