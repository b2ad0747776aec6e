"""The wire formats a reward service may speak (:class:`~lrft.rewards.remote.RemoteReward`'s
``protocol``), without httpx: each turns samples into one JSON request body and reads the reply.

``lrft`` (the default)::

    request:  {"samples": [{"prompt": str, "response": str, "label": str,
                            "reference": str | null, "metadata": {...}}, ...]}
    response: {"scores": [float, ...], "metrics": {"name": [float, ...], ...}}

``openrlhf``: the format OpenRLHF's ``--remote_rm_url`` services speak (its ``serve_rm``, and
LightRFT's, which inherits it)::

    request:  {"query": [prompt + response, ...], "prompts": [prompt, ...],
               "labels": [reference or "", ...]}
    response: {"rewards": [float, ...], "extra_logs": {"name": [float, ...], ...}}

``labels`` carries each sample's reference answer: what OpenRLHF's ``--label_key`` column holds
(lrft's ``--reference_key``; lrft's own labels route rewards and are not sent). ``extra_logs``
is optional and becomes the output's metrics; any other key (OpenRLHF's ``scores``, used there
for dynamic filtering) is ignored. Every list has one entry per sample, in order.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import attrs

from lrft.rewards.base import RewardError, RewardOutput, RewardSample

RETRIES_METRIC = "http_retries"
"""The per-sample metric counting the failed tries before the answer that scored the sample."""


class Malformed(Exception):
    """The service answered, but not in its protocol's format."""


def _number_list(value: Any, what: str, count: int) -> list[float]:
    if not isinstance(value, list) or len(value) != count:
        size = len(value) if isinstance(value, list) else type(value).__name__
        raise Malformed(f"{what} must be a list of {count} numbers, got {size}")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int | float):
            raise Malformed(f"{what} must hold numbers, got {item!r}")
    return [float(item) for item in value]


def _metrics(raw: Any, key: str, count: int) -> dict[str, list[float]]:
    if not isinstance(raw, dict):
        raise Malformed(f"{key!r} must be a JSON object of lists")
    if RETRIES_METRIC in raw:
        raise Malformed(f"metric {RETRIES_METRIC!r} is the client's own count of retried POSTs")
    return {
        str(name): _number_list(values, f"metric {name!r}", count) for name, values in raw.items()
    }


def _lrft_sample(sample: RewardSample) -> dict[str, Any]:
    return {
        "prompt": sample.prompt,
        "response": sample.response,
        "label": sample.label,
        "reference": sample.reference,
        "metadata": dict(sample.metadata),
    }


def encode_lrft(samples: Sequence[RewardSample], *, reward: str, first: int) -> bytes:
    """The ``lrft`` request; a sample whose metadata is not JSON raises :class:`RewardError`
    naming its index (``first`` is the index of ``samples[0]`` in the reward's whole batch)."""
    encoded = []
    for index, sample in enumerate(samples):
        try:
            encoded.append(json.dumps(_lrft_sample(sample), allow_nan=False))
        except (TypeError, ValueError) as error:
            raise RewardError(
                reward=reward,
                sample_index=first + index,
                detail=f"the sample cannot be sent as JSON: {error}",
            ) from error
    return ('{"samples": [' + ", ".join(encoded) + "]}").encode()


def parse_lrft(body: Any, count: int) -> RewardOutput:
    if not isinstance(body, dict) or "scores" not in body:
        raise Malformed("the body must be a JSON object with a 'scores' list")
    scores = _number_list(body["scores"], "'scores'", count)
    return RewardOutput(scores=scores, metrics=_metrics(body.get("metrics", {}), "metrics", count))


def encode_openrlhf(samples: Sequence[RewardSample], *, reward: str, first: int) -> bytes:
    """The ``openrlhf`` request (strings only: it cannot fail to encode)."""
    del reward, first
    body = {
        "query": [sample.prompt + sample.response for sample in samples],
        "prompts": [sample.prompt for sample in samples],
        "labels": [sample.reference or "" for sample in samples],
    }
    return json.dumps(body).encode()


def parse_openrlhf(body: Any, count: int) -> RewardOutput:
    if not isinstance(body, dict) or "rewards" not in body:
        raise Malformed("the body must be a JSON object with a 'rewards' list (OpenRLHF's format)")
    rewards = _number_list(body["rewards"], "'rewards'", count)
    return RewardOutput(
        scores=rewards, metrics=_metrics(body.get("extra_logs", {}), "extra_logs", count)
    )


class Encode(Protocol):
    def __call__(self, samples: Sequence[RewardSample], *, reward: str, first: int) -> bytes: ...


@attrs.frozen(kw_only=True)
class WireFormat:
    """A protocol: how a batch becomes a request body, and how a reply becomes scores."""

    name: str
    encode: Encode
    parse: Callable[[Any, int], RewardOutput]


PROTOCOLS: dict[str, WireFormat] = {
    "lrft": WireFormat(name="lrft", encode=encode_lrft, parse=parse_lrft),
    "openrlhf": WireFormat(name="openrlhf", encode=encode_openrlhf, parse=parse_openrlhf),
}
"""The protocols by name (``--remote_rm_protocol``)."""
