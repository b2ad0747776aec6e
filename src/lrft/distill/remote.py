"""A teacher served over HTTP: per-token logprobs for given token ids, in ``protocol``'s format
(:mod:`lrft.distill.protocols`), one POST per call, under the rules every lrft client of a
service follows (:mod:`lrft.rewards.http_service`: bounded retries with backoff on failures that
may pass, a warning per retry, credentials hidden from every log line, error and ``repr``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import attrs

from lrft.api.validators import finite, non_negative, one_of, positive
from lrft.distill.protocols import TEACHER_PROTOCOLS, TeacherRequest
from lrft.rewards.http_service import (
    JsonService,
    ServiceError,
    check_url,
    frozen_headers,
    headers_repr,
    url_repr,
)
from lrft.rewards.retry import DEFAULT_BACKOFF_S

logger = logging.getLogger(__name__)


class TeacherError(RuntimeError):
    """The teacher service failed for good; the message hides every credential."""


@attrs.frozen(kw_only=True, eq=False)
class RemoteTeacher:
    """Scores token sequences with POSTs of JSON to ``url`` (see the module). ``headers`` go
    with every POST (``Authorization: Bearer ...``); their credential values, like the URL's
    own, are never shown. Close the connection pool with :meth:`close`."""

    url: str = attrs.field(validator=check_url, repr=url_repr)
    protocol: str = attrs.field(default="lrft", validator=one_of(*TEACHER_PROTOCOLS))
    timeout_s: float = attrs.field(default=60.0, validator=[finite, positive])
    max_attempts: int = attrs.field(default=3, validator=positive)
    backoff_s: float = attrs.field(default=DEFAULT_BACKOFF_S, validator=[finite, non_negative])
    headers: Mapping[str, str] = attrs.field(
        factory=dict, converter=frozen_headers, repr=headers_repr
    )
    trust_env: bool = True
    _service: JsonService = attrs.field(
        init=False,
        repr=False,
        default=attrs.Factory(
            lambda self: JsonService(
                url=self.url,
                timeout_s=self.timeout_s,
                max_attempts=self.max_attempts,
                backoff_s=self.backoff_s,
                headers=self.headers,
                trust_env=self.trust_env,
                kind="teacher",
                name=self.protocol,
                log=logger,
            ),
            takes_self=True,
        ),
    )

    def close(self) -> None:
        self._service.close()

    def __enter__(self) -> RemoteTeacher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def logprobs(
        self, requests: Sequence[TeacherRequest], *, temperature: float
    ) -> list[list[float]]:
        """For each request, the teacher's logprob of each token from its ``response_start``
        on, at ``temperature``. Raises :class:`TeacherError` after the last failed try."""
        if not requests:
            return []
        wire = TEACHER_PROTOCOLS[self.protocol]
        body = wire.encode(requests, temperature)
        try:
            rows, _ = self._service.post(body, lambda reply: wire.parse(reply, requests))
        except ServiceError as error:
            raise TeacherError(f"teacher service: {error.detail}") from error
        return rows
