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
are not sent). These are the rules of every lrft client of a service
(:mod:`lrft.rewards.http_service`).

Credentials never reach a log or an error: URLs are shown through
:func:`lrft.redaction.redact` (userinfo and token-like query parameters hidden), and the
values of credential headers (``Authorization``, ``X-Api-Key``...) are hidden from any text the
service or httpx sends back.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import attrs

from lrft.api.validators import one_of, optional, positive_number
from lrft.rewards._checks import name_validator
from lrft.rewards.base import RewardError, RewardOutput, RewardSample
from lrft.rewards.http_service import (
    ClosesService,
    JsonService,
    ServiceError,
    ServiceSettings,
    client_service,
)
from lrft.rewards.remote_protocols import PROTOCOLS, RETRIES_METRIC

__all__ = ["RETRIES_METRIC", "RemoteReward"]

logger = logging.getLogger(__name__)


@attrs.frozen(kw_only=True, eq=False)
class RemoteReward(ServiceSettings, ClosesService):
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

    name: str = attrs.field(default="remote", validator=name_validator)
    protocol: str = attrs.field(default="lrft", validator=one_of(*PROTOCOLS))
    batch_size: int | None = attrs.field(default=None, validator=optional(positive_number))
    """The most samples one POST carries (``None``: the whole batch in one)."""
    max_concurrency: int = attrs.field(default=1, validator=positive_number)
    """The most POSTs of one batch in flight at once."""
    _service: JsonService = attrs.field(
        init=False, repr=False, default=client_service("reward", lambda client: client.name, logger)
    )

    def backoff(self, failed_attempts: int) -> float:
        """Seconds to wait after ``failed_attempts`` failed tries before the next one."""
        return self._service.backoff(failed_attempts)

    @property
    def secrets(self) -> tuple[str, ...]:
        """What is hidden from every message besides URLs (:attr:`JsonService.secrets`)."""
        return self._service.secrets

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
        parse = PROTOCOLS[self.protocol].parse
        try:
            output, attempts = self._service.post(body, lambda reply: parse(reply, count))
        except ServiceError as error:
            raise RewardError(reward=self.name, detail=error.detail) from error
        retries = [float(attempts - 1)] * count
        return RewardOutput(
            scores=output.scores, metrics={**output.metrics, RETRIES_METRIC: retries}
        )
