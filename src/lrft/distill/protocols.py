"""The wire formats a teacher service may speak (:class:`~lrft.distill.remote.RemoteTeacher`'s
``protocol``), without httpx: each turns token sequences into one JSON request body and reads
back, for each sequence, the log-probability of each token from ``response_start`` on given
every token before it.

``lrft`` (the default)::

    request:  {"temperature": float,
               "sequences": [{"token_ids": [int, ...], "response_start": int}, ...]}
    response: {"logprobs": [[float, ...], ...]}

one list per sequence, in order, of ``len(token_ids) - response_start`` numbers:
``log_softmax(logits / temperature)`` of token ``k`` given tokens ``0..k-1``, for each ``k >=
response_start``.

``sglang``: SGLang's ``/generate`` endpoint (what LightRFT's teacher server is), asked to
generate nothing and return the logprob of every input token::

    request:  {"input_ids": [[int, ...], ...], "return_logprob": true, "logprob_start_len": 0,
               "sampling_params": {"max_new_tokens": 0, "temperature": float}}
    response: [{"meta_info": {"input_token_logprobs": [[logprob | null, token_id, text], ...]}},
               ...]

The first entry of each list is the first token's (no logprob: nothing precedes it). Each
entry's token id must be the one sent, which catches a server whose tokenizer or BOS handling
shifts the sequence. How SGLang applies the temperature to input logprobs is SGLang's; lrft
sends it, and compares exactly only at temperature 1.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from lrft.rewards.remote_protocols import Malformed


def _token_ids(values: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(value) for value in values)


@attrs.frozen(kw_only=True)
class TeacherRequest:
    """One sequence to score: its token ids (prompt, then response) and where the response
    starts; the teacher returns a logprob for each token from ``response_start`` on."""

    token_ids: tuple[int, ...] = attrs.field(converter=_token_ids)
    response_start: int

    def __attrs_post_init__(self) -> None:
        if not 1 <= self.response_start < len(self.token_ids):
            raise ValueError(
                f"response_start must be in [1, {len(self.token_ids)}) for {len(self.token_ids)} "
                f"tokens (a response needs a token before it and one token at least), got "
                f"{self.response_start}"
            )

    @property
    def scored(self) -> int:
        return len(self.token_ids) - self.response_start


def _logprobs(values: Any, what: str, count: int) -> list[float]:
    if not isinstance(values, list) or len(values) != count:
        size = len(values) if isinstance(values, list) else type(values).__name__
        raise Malformed(f"{what} must be a list of {count} logprobs, got {size}")
    out = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise Malformed(f"{what} must hold numbers, got {value!r}")
        # a log-probability is finite and at most 0 (1e-4 of slack for the server's rounding)
        if not math.isfinite(value) or value > 1e-4:
            raise Malformed(f"{what} holds {value!r}, which is not a log-probability")
        out.append(float(value))
    return out


def encode_lrft(requests: Sequence[TeacherRequest], temperature: float) -> bytes:
    body = {
        "temperature": temperature,
        "sequences": [
            {"token_ids": list(r.token_ids), "response_start": r.response_start} for r in requests
        ],
    }
    return json.dumps(body).encode()


def parse_lrft(body: Any, requests: Sequence[TeacherRequest]) -> list[list[float]]:
    if not isinstance(body, dict) or not isinstance(body.get("logprobs"), list):
        raise Malformed("the body must be a JSON object with a 'logprobs' list")
    rows = body["logprobs"]
    if len(rows) != len(requests):
        raise Malformed(f"'logprobs' has {len(rows)} lists for {len(requests)} sequences")
    return [
        _logprobs(row, f"'logprobs' of sequence {index}", request.scored)
        for index, (row, request) in enumerate(zip(rows, requests, strict=True))
    ]


def encode_sglang(requests: Sequence[TeacherRequest], temperature: float) -> bytes:
    body = {
        "input_ids": [list(r.token_ids) for r in requests],
        "return_logprob": True,
        "logprob_start_len": 0,
        "sampling_params": {"max_new_tokens": 0, "temperature": temperature},
    }
    return json.dumps(body).encode()


def _sglang_row(item: Any, request: TeacherRequest, index: int) -> list[float]:
    where = f"answer {index}"
    entries = (
        item.get("meta_info", {}).get("input_token_logprobs") if isinstance(item, dict) else None
    )
    if not isinstance(entries, list) or len(entries) != len(request.token_ids):
        raise Malformed(
            f"{where} must carry meta_info.input_token_logprobs with one entry per input token "
            f"({len(request.token_ids)})"
        )
    values = []
    for position in range(request.response_start, len(entries)):
        entry = entries[position]
        if not isinstance(entry, list) or len(entry) < 2:
            raise Malformed(f"{where}, token {position}: expected [logprob, token_id, ...]")
        if entry[1] != request.token_ids[position]:
            raise Malformed(
                f"{where}, token {position}: the server scored token {entry[1]!r} where "
                f"{request.token_ids[position]} was sent (its tokenizer or BOS handling differs)"
            )
        values.append(entry[0])
    return _logprobs(values, f"{where}'s logprobs", request.scored)


def parse_sglang(body: Any, requests: Sequence[TeacherRequest]) -> list[list[float]]:
    answers = [body] if isinstance(body, dict) and len(requests) == 1 else body
    if not isinstance(answers, list) or len(answers) != len(requests):
        raise Malformed(f"the body must be a list of {len(requests)} answers (SGLang's batch)")
    return [
        _sglang_row(item, request, index)
        for index, (item, request) in enumerate(zip(answers, requests, strict=True))
    ]


@attrs.frozen(kw_only=True)
class TeacherWireFormat:
    name: str
    encode: Callable[[Sequence[TeacherRequest], float], bytes]
    parse: Callable[[Any, Sequence[TeacherRequest]], list[list[float]]]


TEACHER_PROTOCOLS: dict[str, TeacherWireFormat] = {
    "lrft": TeacherWireFormat(name="lrft", encode=encode_lrft, parse=parse_lrft),
    "sglang": TeacherWireFormat(name="sglang", encode=encode_sglang, parse=parse_sglang),
}
"""The protocols by name (``--teacher_protocol``)."""
