"""Reward services speaking OpenRLHF's format, batching and the concurrency limit, against a real
HTTP server on 127.0.0.1 (``http.server`` in a thread); the auth header read from an environment
variable goes with every POST and never into an error."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from lrft.rewards import RemoteReward, RewardError, RewardSample, compute_rewards
from lrft.rewards.remote import RETRIES_METRIC
from lrft.trainer.rewards import auth_headers
from tests.unit.rewards.test_remote import Reply, ScriptedServer

SAMPLES = [
    RewardSample(prompt=f"{a}+{a}=", response=str(2 * a), reference=str(2 * a) if a % 2 else None)
    for a in range(1, 8)
]


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[int, dict[str, Any]], Reply]], ScriptedServer]]:
    servers: list[ScriptedServer] = []

    def start(script: Callable[[int, dict[str, Any]], Reply]) -> ScriptedServer:
        servers.append(ScriptedServer(script))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def openrlhf_service(body: dict[str, Any]) -> dict[str, Any]:
    """What OpenRLHF's serve_rm answers: a reward per query (here its length), plus OpenRLHF's
    own keys: scores (for its dynamic filtering) and extra_logs."""
    rewards = [float(len(query)) for query in body["query"]]
    return {
        "rewards": rewards,
        "scores": [0.0] * len(rewards),
        "extra_logs": {"has_label": [float(bool(label)) for label in body["labels"]]},
    }


def client(url: str, **kwargs: Any) -> RemoteReward:
    options: dict[str, Any] = {"timeout_s": 5.0, "backoff_s": 0.05, "trust_env": False}
    return RemoteReward(url=url, **(options | kwargs))


def test_openrlhf_requests_and_replies(serve: Any) -> None:
    server = serve(lambda n, body: (200, openrlhf_service(body)))
    with client(server.url, protocol="openrlhf") as reward:
        output = compute_rewards(reward, SAMPLES[:3])
    assert server.requests == [
        {
            "query": ["1+1=2", "2+2=4", "3+3=6"],
            "prompts": ["1+1=", "2+2=", "3+3="],
            "labels": ["2", "", "6"],  # the references; "" for a sample without one
        }
    ]
    assert output.scores == (5.0, 5.0, 5.0)
    assert output.metrics["has_label"] == (1.0, 0.0, 1.0)  # extra_logs
    assert output.metrics[RETRIES_METRIC] == (0.0, 0.0, 0.0)
    assert set(output.metrics) == {"has_label", RETRIES_METRIC}  # OpenRLHF's scores ignored


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        ({"scores": [1.0, 2.0]}, r"with a 'rewards' list \(OpenRLHF's format\)"),
        ({"rewards": [1.0]}, r"'rewards' must be a list of 2 numbers, got 1"),
        ({"rewards": [1.0, "x"]}, r"'rewards' must hold numbers, got 'x'"),
        ({"rewards": [1.0, 2.0], "extra_logs": [1]}, r"'extra_logs' must be a JSON object"),
        ({"rewards": [1.0, 2.0], "extra_logs": {RETRIES_METRIC: [0, 0]}}, r"client's own count"),
    ],
)
def test_a_malformed_openrlhf_reply_fails_at_once(
    serve: Any, reply: dict[str, Any], message: str
) -> None:
    server = serve(lambda n, body: (200, reply))
    with client(server.url, protocol="openrlhf") as reward, pytest.raises(RewardError) as caught:
        compute_rewards(reward, SAMPLES[:2])
    assert "malformed reply, not retried" in str(caught.value)
    assert len(server.requests) == 1
    assert caught.match(message)


def test_batches_are_cut_into_posts_and_joined_in_order(serve: Any) -> None:
    server = serve(lambda n, body: (200, openrlhf_service(body)))
    with client(server.url, protocol="openrlhf", batch_size=3) as reward:
        output = compute_rewards(reward, SAMPLES)
    assert [body["prompts"] for body in server.requests] == [
        [s.prompt for s in SAMPLES[0:3]],
        [s.prompt for s in SAMPLES[3:6]],
        [s.prompt for s in SAMPLES[6:7]],
    ]
    assert output.scores == tuple(float(len(s.prompt + s.response)) for s in SAMPLES)
    assert output.metrics["has_label"] == tuple(float(s.reference is not None) for s in SAMPLES)
    # the lrft protocol is cut the same way
    lrft = serve(lambda n, body: (200, {"scores": [len(s["response"]) for s in body["samples"]]}))
    with client(lrft.url, batch_size=4) as reward:
        assert compute_rewards(reward, SAMPLES).scores == tuple(
            float(len(s.response)) for s in SAMPLES
        )
    assert [len(body["samples"]) for body in lrft.requests] == [4, 3]


class InFlight:
    """Counts the POSTs being answered at once; with ``together`` set, each waits (at most 10 s)
    until that many are in flight, so that the count does not depend on thread timing."""

    def __init__(self, together: int | None) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.barrier = None if together is None else threading.Barrier(together, timeout=10)

    def __call__(self, n: int, body: dict[str, Any]) -> Reply:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        if self.barrier is not None:
            self.barrier.wait()
        else:
            time.sleep(0.05)  # room for another POST to arrive, were one sent
        with self.lock:
            self.now -= 1
        return 200, {
            "scores": [len(s["response"]) + 10 * int(s["prompt"][0]) for s in body["samples"]]
        }


@pytest.mark.parametrize("limit", [1, 2, 3])
def test_at_most_max_concurrency_posts_are_in_flight(serve: Any, limit: int) -> None:
    samples = SAMPLES[:6]
    counter = InFlight(together=None if limit == 1 else limit)
    server = serve(counter)
    with client(server.url, batch_size=1, max_concurrency=limit) as reward:
        output = compute_rewards(reward, samples)
    assert counter.most == limit
    assert len(server.requests) == 6
    # joined in the batch's order, whatever order the POSTs were answered in
    assert output.scores == tuple(float(len(s.response) + 10 * int(s.prompt[0])) for s in samples)


def test_a_failed_post_fails_the_batch_and_sends_no_more(serve: Any) -> None:
    server = serve(
        lambda n, body: (400, {"error": "bad"}) if n == 2 else (200, openrlhf_service(body))
    )
    with (
        client(server.url, protocol="openrlhf", batch_size=2) as reward,
        pytest.raises(RewardError, match="HTTP 400, not retried"),
    ):
        compute_rewards(reward, SAMPLES[:6])
    assert len(server.requests) == 2


def test_the_auth_header_comes_from_the_environment_and_stays_secret(
    serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LRFT_TEST_RM_TOKEN", "s3cr3t-token")
    # a service that echoes what it got: the error must not repeat the token
    server = serve(lambda n, body: (401, {"seen": "Bearer s3cr3t-token"}))
    reward = client(server.url, protocol="openrlhf", headers=auth_headers("LRFT_TEST_RM_TOKEN"))
    with reward, pytest.raises(RewardError) as caught:
        compute_rewards(reward, SAMPLES[:2])
    assert server.headers[0]["authorization"] == "Bearer s3cr3t-token"
    assert "s3cr3t-token" not in str(caught.value)
    assert "s3cr3t-token" not in repr(reward)
    assert json.dumps(server.requests).find("s3cr3t") == -1  # never in a body


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match=r"protocol must be one of 'lrft', 'openrlhf', got 'grpc'"):
        RemoteReward(url="http://127.0.0.1:9/x", protocol="grpc")
    with pytest.raises(ValueError, match=r"max_concurrency must be > 0"):
        RemoteReward(url="http://127.0.0.1:9/x", max_concurrency=0)
    with pytest.raises(ValueError, match=r"batch_size must be > 0"):
        RemoteReward(url="http://127.0.0.1:9/x", batch_size=0)
