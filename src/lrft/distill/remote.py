"""A teacher served over HTTP: per-token logprobs for given token ids, in ``protocol``'s format
(:mod:`lrft.distill.protocols`), one POST per call, under the rules every lrft client of a
service follows (:mod:`lrft.rewards.http_service`: bounded retries with backoff on failures that
may pass, a warning per retry, credentials hidden from every log line, error and ``repr``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import attrs

from lrft.api.validators import one_of
from lrft.distill.protocols import TEACHER_PROTOCOLS, TeacherRequest
from lrft.rewards.http_service import (
    ClosesService,
    JsonService,
    ServiceError,
    ServiceSettings,
    client_service,
)

logger = logging.getLogger(__name__)


class TeacherError(RuntimeError):
    """The teacher service failed for good; the message hides every credential."""


@attrs.frozen(kw_only=True, eq=False)
class RemoteTeacher(ServiceSettings, ClosesService):
    """Scores token sequences with POSTs of JSON to ``url`` in ``protocol``'s format (see the
    module and :class:`~lrft.rewards.http_service.ServiceSettings`); ``headers`` carry its
    token (``Authorization: Bearer ...``). Close the connection pool with :meth:`close`."""

    protocol: str = attrs.field(default="lrft", validator=one_of(*TEACHER_PROTOCOLS))
    _service: JsonService = attrs.field(
        init=False,
        repr=False,
        default=client_service("teacher", lambda client: client.protocol, logger),
    )

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
