"""``lrft.dist.watchdog``: a peer stopped with SIGSTOP is reported with its phase and step, and a
backend's collective timeout becomes one line naming this rank, its phase and step, and the peers.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest
from torch._C._distributed_c10d import FileStore, HashStore

from lrft.api.errors import CollectiveTimeout
from lrft.dist.watchdog import PhaseWatch, heartbeat_interval_s, is_collective_timeout
from lrft.rewards import RewardError

GLOO_TIMEOUT = (
    "[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 10000ms for recv operation"
)


def _peer(store_path: str, ready: str) -> None:
    """Rank 1: enters phase 'rewards' of step 2, says so, then stops itself as SIGSTOP would."""
    store = FileStore(store_path, 2)
    watch = PhaseWatch(rank=1, world_size=2, timeout_s=2.0, store=store)
    watch.start()
    watch.begin_step(2)
    with watch.phase("rewards"):
        Path(ready).touch()
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(60)  # after SIGCONT: alive again, beating, until the parent kills it


def _wait_for(condition: object, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.05)


def test_a_stopped_peer_is_reported_once_then_heard_from_again(tmp_path: Path) -> None:
    store_path, ready = str(tmp_path / "store"), tmp_path / "ready"
    child = multiprocessing.get_context("spawn").Process(
        target=_peer, args=(store_path, str(ready)), daemon=True
    )
    child.start()
    lines: list[str] = []
    try:
        _wait_for(ready.exists, 60)
        assert ready.exists(), "the peer never entered its phase"
        watch = PhaseWatch(
            rank=0,
            world_size=2,
            timeout_s=2.0,
            store=FileStore(store_path, 2),
            report=lines.append,
        )
        watch.begin_step(2)
        with watch.phase("policy"):
            watch.start()
            _wait_for(lambda: lines, 10)  # silent for stall_after_s(2.0) = 1 s
            time.sleep(3 * heartbeat_interval_s(2.0))
            assert len(lines) == 1, lines  # once, not at every beat
            assert lines[0].startswith("lrft: rank 0: rank 1 has not been heard from for ")
            assert "its last report: phase 'rewards' of step 2" in lines[0]
            assert "rank 0 is in phase 'policy' of step 2" in lines[0]
            assert "collectives fail after 2 s (--collective_timeout_s)" in lines[0]
            os.kill(child.pid, signal.SIGCONT)  # type: ignore[arg-type]
            _wait_for(lambda: len(lines) > 1, 10)
        assert lines[1:] == ["lrft: rank 0: rank 1 is heard from again"]
        watch.close()
    finally:
        if child.pid is not None:
            os.kill(child.pid, signal.SIGCONT)
        child.kill()
        child.join(timeout=10)


def _pair() -> tuple[PhaseWatch, PhaseWatch]:
    store = HashStore()
    return (
        PhaseWatch(rank=0, world_size=2, timeout_s=10.0, store=store),
        PhaseWatch(rank=1, world_size=2, timeout_s=10.0, store=store),
    )


def test_a_collective_timeout_names_the_rank_the_phase_the_step_and_the_peer() -> None:
    watch, peer = _pair()
    peer.start()
    peer.begin_step(3)
    with peer.phase("generate"):
        watch.begin_step(3)
        with pytest.raises(CollectiveTimeout) as info, watch.phase("fit"), watch.phase("policy"):
            raise RuntimeError(GLOO_TIMEOUT)
    peer.close()
    message = str(info.value)
    assert message.startswith(
        "rank 0: a collective did not complete within 10 s (--collective_timeout_s) in phase "
        "'policy' of step 3; rank 1 last reported phase 'generate' of step 3 0 s ago; "
        "the backend said: [gloo/"
    )
    assert "\n" not in message
    assert isinstance(info.value.__cause__, RuntimeError)  # the backend's error is kept


def test_a_timeout_wrapped_by_a_reward_is_still_a_collective_timeout() -> None:
    watch, peer = _pair()
    peer.start()
    peer.close(failed=True)
    try:
        raise RuntimeError(GLOO_TIMEOUT)
    except RuntimeError as error:
        wrapped = RewardError(reward="rm", detail=f"agreeing on the batch size raised {error}")
        wrapped.__cause__ = error
    with (
        pytest.raises(
            CollectiveTimeout, match=r"in phase 'rewards' before step 1; rank 1 had failed"
        ),
        watch.phase("rewards"),
    ):
        raise wrapped


def test_other_errors_pass_through_unchanged() -> None:
    watch, _ = _pair()
    for error in (ValueError("a timeout value"), RuntimeError("CUDA out of memory")):
        with pytest.raises(type(error)) as info, watch.phase("policy"):
            raise error
        assert info.value is error
    assert not is_collective_timeout(ValueError("timed out"))  # only backend (runtime) errors
    assert watch.phase_name == "startup"  # every phase was left
