"""The remote reward client against a real HTTP server on 127.0.0.1 started by each test."""

from __future__ import annotations

import base64
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from lrft.rewards import RemoteReward, RewardError, RewardFn, RewardSample, compute_rewards
from lrft.rewards.remote import RETRIES_METRIC

Reply = tuple[int, Any]  # (status, JSON body); a body of type bytes is sent as it is


class ScriptedServer:
    """Answers the n-th POST with ``script(n, request_body)``; records every request (its
    body, its path and its headers with lower-case names)."""

    def __init__(self, script: Callable[[int, dict[str, Any]], Reply]) -> None:
        self.script = script
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.paths: list[str] = []
        self.times: list[float] = []
        self.release = threading.Event()  # lets slow handlers finish at teardown
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                server.times.append(time.monotonic())
                server.headers.append({k.lower(): v for k, v in self.headers.items()})
                server.paths.append(self.path)
                server.requests.append(body)
                status, reply = server.script(len(server.requests), body)
                data = reply if isinstance(reply, bytes) else json.dumps(reply).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (the timeout test)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep the test output clean

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/score"
        # A short poll interval: shutdown() waits for the loop to notice, 0.5 s by default.
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[int, dict[str, Any]], Reply]], ScriptedServer]]:
    servers: list[ScriptedServer] = []

    def start(script: Callable[[int, dict[str, Any]], Reply]) -> ScriptedServer:
        servers.append(ScriptedServer(script))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def length_scores(body: dict[str, Any]) -> dict[str, Any]:
    """The service under test: score = characters in the response, metric = has a reference."""
    samples = body["samples"]
    return {
        "scores": [len(s["response"]) for s in samples],
        "metrics": {"has_reference": [float(s["reference"] is not None) for s in samples]},
    }


BATCH = [
    RewardSample(prompt="Q1", response="abc", label="math", reference="3", metadata={"id": 7}),
    RewardSample(prompt="Q2", response="hello!", label="chat"),
]


def client(url: str, **kwargs: Any) -> RemoteReward:
    # trust_env=False: a proxy configured in the environment must not intercept loopback calls.
    options: dict[str, Any] = {"timeout_s": 5.0, "backoff_s": 0.05, "trust_env": False}
    return RemoteReward(url=url, **(options | kwargs))


def test_success_sends_the_wire_format_and_reads_scores_and_metrics(serve: Any) -> None:
    server = serve(lambda n, body: (200, length_scores(body)))
    with client(server.url) as reward:
        assert isinstance(reward, RewardFn)
        output = compute_rewards(reward, BATCH)
    assert output.scores == (3.0, 6.0)
    assert output.metrics["has_reference"] == (1.0, 0.0)
    assert output.metrics[RETRIES_METRIC] == (0.0, 0.0)
    assert server.requests == [
        {
            "samples": [
                {
                    "prompt": "Q1",
                    "response": "abc",
                    "label": "math",
                    "reference": "3",
                    "metadata": {"id": 7},
                },
                {
                    "prompt": "Q2",
                    "response": "hello!",
                    "label": "chat",
                    "reference": None,
                    "metadata": {},
                },
            ]
        }
    ]


def test_a_server_that_fails_twice_then_succeeds(serve: Any) -> None:
    server = serve(
        lambda n, body: (503, {"error": "warming up"}) if n <= 2 else (200, length_scores(body))
    )
    with client(server.url, max_attempts=3, backoff_s=0.05) as reward:
        assert compute_rewards(reward, BATCH).scores == (3.0, 6.0)
    assert len(server.requests) == 3
    gaps = [b - a for a, b in zip(server.times, server.times[1:], strict=False)]
    # exponential backoff: 0.05 s, then 0.1 s
    assert gaps[0] >= 0.05
    assert gaps[1] >= 0.10


def test_a_500_then_a_200_is_logged_once_and_counted(
    serve: Any, caplog: pytest.LogCaptureFixture
) -> None:
    server = serve(
        lambda n, body: (500, {"error": "busy"}) if n == 1 else (200, length_scores(body))
    )
    caplog.set_level(logging.WARNING, logger="lrft.rewards.remote")
    with client(server.url, max_attempts=3, backoff_s=0.05, name="judge") as reward:
        output = compute_rewards(reward, BATCH)
    assert output.scores == (3.0, 6.0)
    assert output.metrics[RETRIES_METRIC] == (1.0, 1.0)  # one failed try before the answer
    assert len(server.requests) == 2
    retries = [r for r in caplog.records if r.name == "lrft.rewards.remote"]
    assert [r.levelno for r in retries] == [logging.WARNING]
    line = retries[0].getMessage()
    assert "reward 'judge'" in line
    assert "attempt 1 of 3 failed (HTTP 500)" in line
    assert "retrying in 0.05 s" in line


def test_secrets_in_the_url_and_a_key_header_reach_no_error_log_or_repr(
    serve: Any, caplog: pytest.LogCaptureFixture
) -> None:
    password, token, key = "pw-5f1c", "tok-9a2e", "key-77d0"

    def echo(n: int, body: dict[str, Any]) -> Reply:
        # a service that echoes what it got, as some error pages do
        seen = server.headers[-1]
        return 503, {"seen": [seen["authorization"], seen["x-api-key"]], "query": token}

    server = serve(echo)
    port = server.url.split(":")[2].split("/")[0]
    url = f"http://alice:{password}@127.0.0.1:{port}/score?task=math&access_token={token}"
    caplog.set_level(logging.DEBUG)  # httpx logs each request's URL at INFO
    with client(url, max_attempts=2, headers={"X-Api-Key": key}) as reward:
        text = repr(reward)
        with pytest.raises(RewardError) as info:
            compute_rewards(reward, BATCH)
    # the credentials did go out: the userinfo as basic auth, the query token, the header
    basic = base64.b64encode(f"alice:{password}".encode()).decode()
    assert server.headers[0]["authorization"] == f"Basic {basic}"
    assert server.headers[0]["x-api-key"] == key
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "HTTP Request: POST" in logged  # httpx's own line is there, redacted
    for shown in (str(info.value), text, logged):
        for secret in (password, token, key, basic):
            assert secret not in shown, (secret, shown)
    message = str(info.value)
    assert "POST http://***@127.0.0.1:" in message
    assert "task=math&access_token=***" in message
    assert "Basic ***" in message  # the echoed headers, hidden
    assert "attempt 1 of 2 failed (HTTP 503)" in logged


def test_a_server_that_always_fails_gives_a_clear_error_after_the_last_try(serve: Any) -> None:
    server = serve(lambda n, body: (500, {"error": "broken"}))
    with (
        client(server.url, max_attempts=4, backoff_s=0.01) as reward,
        pytest.raises(RewardError) as info,
    ):
        compute_rewards(reward, BATCH)
    message = str(info.value)
    assert server.url in message
    assert "failed after 4 attempts" in message
    assert "HTTP 500" in message
    assert "broken" in message
    assert len(server.requests) == 4


def test_a_slow_server_times_out_on_every_try(serve: Any) -> None:
    def slow(n: int, body: dict[str, Any]) -> Reply:
        server.release.wait(timeout=5.0)
        return 200, length_scores(body)

    server = serve(slow)
    start = time.monotonic()
    with (
        client(server.url, timeout_s=0.2, max_attempts=2, backoff_s=0.01) as reward,
        pytest.raises(RewardError, match=r"failed after 2 attempts: last failure: ReadTimeout"),
    ):
        compute_rewards(reward, BATCH)
    assert time.monotonic() - start < 3.0  # two 0.2 s timeouts, not the server's 5 s
    assert len(server.requests) == 2


def test_a_client_error_is_not_retried(serve: Any) -> None:
    server = serve(lambda n, body: (400, {"error": "no such task"}))
    with (
        client(server.url, max_attempts=3) as reward,
        pytest.raises(
            RewardError, match=r"failed after 1 attempt: HTTP 400, not retried: .*no such task"
        ),
    ):
        compute_rewards(reward, BATCH)
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (b"not json", "malformed reply"),
        ({"score": [1, 2]}, "a JSON object with a 'scores' list"),
        ({"scores": [1.0]}, "'scores' must be a list of 2 numbers, got 1"),
        ({"scores": [1.0, "2"]}, "'scores' must hold numbers, got '2'"),
        ({"scores": [1.0, True]}, "must hold numbers, got True"),
        ({"scores": [1, 2], "metrics": {"m": [1]}}, "metric 'm' must be a list of 2 numbers"),
    ],
)
def test_a_malformed_reply_is_reported_without_retrying(
    serve: Any, reply: Any, message: str
) -> None:
    server = serve(lambda n, body: (200, reply))
    with client(server.url) as reward, pytest.raises(RewardError, match=message):
        compute_rewards(reward, BATCH)
    assert len(server.requests) == 1


def test_a_nan_score_from_the_service_names_the_sample(serve: Any) -> None:
    server = serve(lambda n, body: (200, b'{"scores": [1.0, NaN]}'))
    with (
        client(server.url) as reward,
        pytest.raises(RewardError, match=r"at sample 1: .*non-finite"),
    ):
        compute_rewards(reward, BATCH)


def test_metadata_that_is_not_json_names_the_sample(serve: Any) -> None:
    server = serve(lambda n, body: (200, length_scores(body)))
    batch = [BATCH[0], RewardSample(prompt="", response="", metadata={"when": object()})]
    with client(server.url) as reward, pytest.raises(RewardError, match=r"at sample 1: .*as JSON"):
        compute_rewards(reward, batch)
    assert server.requests == []


def test_a_refused_connection_is_retried_then_reported() -> None:
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}/score"
    with (
        client(url, max_attempts=2, backoff_s=0.01) as reward,
        pytest.raises(RewardError, match=r"failed after 2 attempts: last failure: ConnectError"),
    ):
        compute_rewards(reward, BATCH)


def test_an_empty_batch_sends_nothing(serve: Any) -> None:
    server = serve(lambda n, body: (200, length_scores(body)))
    with client(server.url) as reward:
        assert compute_rewards(reward, []).scores == ()
    assert server.requests == []


def test_backoff_doubles_up_to_its_cap() -> None:
    with RemoteReward(url="http://127.0.0.1:9/x", backoff_s=0.5, max_backoff_s=3.0) as reward:
        assert [reward.backoff(k) for k in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 3.0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"url": "127.0.0.1:8000/score"}, "url must be an http:// or https:// URL"),
        ({"url": "ftp://127.0.0.1/x"}, "url must be an http:// or https:// URL"),
        ({"max_attempts": 0}, "max_attempts must be > 0, got 0"),
        ({"timeout_s": -1.0}, "timeout_s must be > 0"),
        ({"backoff_s": -0.1}, "backoff_s must be >= 0"),
    ],
)
def test_validation(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RemoteReward(**({"url": "http://127.0.0.1:9/x"} | kwargs))


def test_without_httpx_the_package_imports_and_the_error_names_the_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    import lrft.rewards

    monkeypatch.setitem(sys.modules, "httpx", None)  # None in sys.modules: "not installed"
    monkeypatch.delitem(sys.modules, "lrft.rewards.remote")
    monkeypatch.delitem(sys.modules, "lrft.rewards.http_service")
    with pytest.raises(ImportError, match=r"RemoteReward needs httpx: pip install 'httpx>=0.28'"):
        lrft.rewards.RemoteReward  # noqa: B018  (the attribute access is what is tested)
