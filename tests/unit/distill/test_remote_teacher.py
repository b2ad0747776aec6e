"""The remote teacher client against a real HTTP server on 127.0.0.1 started by each test: a
server that scores with a tiny causal LM, in lrft's format and in SGLang's, with the same auth,
retry and redaction rules as the remote reward."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from lrft.distill import TeacherRequest
from lrft.distill.remote import RemoteTeacher, TeacherError
from lrft.testing.models import tiny_causal_lm

MODEL = tiny_causal_lm(seed=3)
MODEL.train(False)
REQUESTS = [
    TeacherRequest(token_ids=(5, 17, 42, 9, 100), response_start=3),
    TeacherRequest(token_ids=(7, 7, 8), response_start=1),
]


def _model_logprobs(token_ids: list[int], temperature: float) -> list[float]:
    """Every token's logprob given the tokens before it (the first token's is not defined)."""
    with torch.no_grad():
        logits = MODEL(input_ids=torch.tensor([token_ids])).logits[0].double()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    return [float(logprobs[k - 1, token_ids[k]]) for k in range(1, len(token_ids))]


def lrft_teacher(body: dict[str, Any]) -> dict[str, Any]:
    rows = []
    for sequence in body["sequences"]:
        every = _model_logprobs(sequence["token_ids"], body["temperature"])
        rows.append(every[sequence["response_start"] - 1 :])
    return {"logprobs": rows}


def sglang_teacher(body: dict[str, Any], shift: int = 0) -> list[dict[str, Any]]:
    assert body["sampling_params"]["max_new_tokens"] == 0
    assert body["return_logprob"]
    answers = []
    for ids in body["input_ids"]:
        every = [None, *_model_logprobs(ids, body["sampling_params"]["temperature"])]
        entries = [[lp, token + shift, None] for lp, token in zip(every, ids, strict=True)]
        answers.append({"text": "", "meta_info": {"input_token_logprobs": entries}})
    return answers


def _expected(temperature: float) -> list[list[float]]:
    return [
        _model_logprobs(list(r.token_ids), temperature)[r.response_start - 1 :] for r in REQUESTS
    ]


def client(url: str, **kwargs: Any) -> RemoteTeacher:
    # trust_env=False: a proxy configured in the environment must not intercept loopback calls.
    return RemoteTeacher(
        url=url, **({"timeout_s": 5.0, "backoff_s": 0.02, "trust_env": False} | kwargs)
    )


@pytest.mark.parametrize("protocol", ["lrft", "sglang"])
def test_the_teachers_logprobs_of_each_response_token(serve: Any, protocol: str) -> None:
    answer = lrft_teacher if protocol == "lrft" else sglang_teacher
    server = serve(lambda n, body: (200, answer(body)))
    with client(server.url, protocol=protocol) as teacher:
        got = teacher.logprobs(REQUESTS, temperature=0.7)
    assert [len(row) for row in got] == [2, 2]
    for row, want in zip(got, _expected(0.7), strict=True):
        assert row == pytest.approx(want, abs=1e-9)
    assert len(server.requests) == 1  # one POST for the batch
    if protocol == "lrft":
        assert server.requests[0] == {
            "temperature": 0.7,
            "sequences": [
                {"token_ids": [5, 17, 42, 9, 100], "response_start": 3},
                {"token_ids": [7, 7, 8], "response_start": 1},
            ],
        }


def test_a_server_that_scores_other_tokens_is_refused_without_retrying(serve: Any) -> None:
    server = serve(lambda n, body: (200, sglang_teacher(body, shift=1)))
    with (
        client(server.url, protocol="sglang") as teacher,
        pytest.raises(TeacherError, match=r"not retried: .*scored token 10 where 9 was sent"),
    ):
        teacher.logprobs(REQUESTS, temperature=1.0)
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        ({"logprobs": [[-1.0]]}, "'logprobs' has 1 lists for 2 sequences"),
        ({"logprobs": [[-1.0], [-1.0, -2.0]]}, "sequence 0 must be a list of 2 logprobs, got 1"),
        ({"logprobs": [[-1.0, 0.5], [-1.0, -2.0]]}, "holds 0.5, which is not a log-probability"),
        ({"scores": []}, "with a 'logprobs' list"),
    ],
)
def test_a_malformed_reply_names_what_is_wrong(serve: Any, reply: Any, message: str) -> None:
    server = serve(lambda n, body: (200, reply))
    with client(server.url) as teacher, pytest.raises(TeacherError, match=message):
        teacher.logprobs(REQUESTS, temperature=1.0)
    assert len(server.requests) == 1


def test_retries_auth_and_redaction_follow_the_remote_rewards_rules(
    serve: Any, caplog: pytest.LogCaptureFixture
) -> None:
    token = "teacher-secret-7f3a"
    # the first answer echoes the credentials, as a careless proxy's error page might
    server = serve(
        lambda n, body: (
            (503, {"echo": f"Bearer {token} sig=qs-secret"})
            if n == 1
            else (200, lrft_teacher(body))
        )
    )
    caplog.set_level(logging.DEBUG)
    url = f"{server.url}?sig=qs-secret"
    with client(url, headers={"Authorization": f"Bearer {token}"}, max_attempts=2) as teacher:
        assert token not in repr(teacher)
        assert "qs-secret" not in repr(teacher)
        got = teacher.logprobs(REQUESTS, temperature=1.0)
    for row, want in zip(got, _expected(1.0), strict=True):
        assert row == pytest.approx(want, abs=1e-9)
    assert [h["authorization"] for h in server.headers] == [f"Bearer {token}"] * 2
    retries = [r for r in caplog.records if r.name == "lrft.distill.remote"]
    assert len(retries) == 1
    assert "teacher 'lrft'" in retries[0].getMessage()
    assert "attempt 1 of 2 failed (HTTP 503)" in retries[0].getMessage()
    failing = serve(lambda n, body: (503, {"echo": f"Bearer {token} sig=qs-secret"}))
    with (
        client(
            f"{failing.url}?sig=qs-secret",
            headers={"Authorization": f"Bearer {token}"},
            max_attempts=2,
        ) as teacher,
        pytest.raises(TeacherError, match="failed after 2 attempts") as failure,
    ):
        teacher.logprobs(REQUESTS, temperature=1.0)
    logged = "\n".join(record.getMessage() for record in caplog.records)
    for text in (str(failure.value), logged):
        assert token not in text
        assert "qs-secret" not in text


def test_requests_are_checked() -> None:
    with pytest.raises(ValueError, match=r"response_start must be in \[1, 3\)"):
        TeacherRequest(token_ids=(1, 2, 3), response_start=3)
    with pytest.raises(ValueError, match="protocol must be one of"):
        RemoteTeacher(url="http://127.0.0.1:9/x", protocol="vllm")
