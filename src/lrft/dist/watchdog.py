"""Which phase every rank is in, so that a stalled collective names the rank, the phase and the step.

A collective waits for every rank of its group. When one never arrives (stopped by SIGSTOP, dead,
stuck in a kernel), the others fail after the process group's timeout with a backend error that
names neither the missing rank nor what anyone was doing (gloo in torch 2.13: ``Timed out waiting
600000ms for recv operation to complete``). :class:`PhaseWatch` keeps this rank's phase (a stack of
names the trainer pushes: ``generate``, ``rewards``, ``policy``, ``weight_sync``, ``eval``,
``checkpoint``...) and its step, and a daemon thread publishes them with a beat counter to the
process group's key-value store, where every rank reads the others'. Two reports follow from it:

- the thread prints one line to stderr as soon as a peer's beat has not changed for
  :func:`stall_after_s` (a stopped or dead process publishes nothing, while a busy one still
  does), naming that rank, its last phase and step, and this rank's;
- a collective timeout raised inside :meth:`PhaseWatch.phase` becomes a :class:`CollectiveTimeout`
  whose one-line message names this rank, its phase and step, and every peer's state.

The thread only reads and writes the store: it never touches a process group, so it cannot
deadlock with the collectives it watches. With NCCL, whose own watchdog aborts the process at the
timeout instead of raising in Python, the stall line is the report that names the phase.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import attrs
import torch.distributed as dist

from lrft.api.errors import CollectiveTimeout

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store

HEARTBEAT_KEY = "lrft/heartbeat/{rank}"
RUNNING, FINISHED, FAILED = "running", "finished", "failed"

# How the backends word a timeout (torch 2.13): gloo "Timed out waiting 600000ms for recv
# operation to complete" and then "Application timeout caused pair closure"; NCCL with blocking
# wait and the stores "... timed out ..." / "Timed out after ... seconds".
_TIMEOUT_TEXT = re.compile(r"timed out|timeout", re.IGNORECASE)


def heartbeat_interval_s(timeout_s: float) -> float:
    """How often a rank publishes its phase: a twentieth of the timeout, within [0.2, 5] s."""
    return min(5.0, max(0.2, timeout_s / 20))


def stall_after_s(timeout_s: float) -> float:
    """How long a peer may stay silent before it is reported: half the timeout, within [1, 60] s
    (a rank busy in a long phase still beats; only a stopped or dead one goes silent)."""
    return min(60.0, max(1.0, timeout_s / 2))


def _who(rank: int, role: str | None) -> str:
    return f"rank {rank}" if role is None else f"rank {rank} ({role})"


def _where(phase: str, step: int) -> str:
    return f"phase {phase!r} of step {step}" if step > 0 else f"phase {phase!r} before step 1"


@attrs.frozen(kw_only=True)
class PeerState:
    """What a peer last published, and for how long its beat has not changed."""

    rank: int
    phase: str
    step: int
    state: str
    silent_s: float
    role: str | None = None

    @property
    def who(self) -> str:
        return _who(self.rank, self.role)

    def describe(self) -> str:
        if self.state == FINISHED:
            return f"{self.who} had finished"
        if self.state == FAILED:
            return f"{self.who} had failed in {_where(self.phase, self.step)}"
        return f"{self.who} last reported {_where(self.phase, self.step)} {self.silent_s:.0f} s ago"


def is_collective_timeout(error: BaseException) -> bool:
    """Whether ``error``, or an error it was raised from, is a backend's collective timeout."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, RuntimeError) and _TIMEOUT_TEXT.search(str(current)):
            return True
        current = current.__cause__ or current.__context__
    return False


def _report_to_stderr(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _default_store() -> Store | None:
    if not dist.is_initialized():
        return None
    try:
        # Private in torch 2.13 (and 2.11), but the only handle on the store that the default
        # group rendezvoused through, which every rank can reach without a collective.
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store()
    except (ImportError, RuntimeError, ValueError):
        return None


class PhaseWatch:
    """This rank's phase and step, published for its peers; see the module docstring.

    ``store`` is where the ranks publish (``None``: this rank's own phase is still named in
    timeouts, the peers' are unknown). ``timeout_s`` is the process group's collective timeout,
    from which the beat interval and the stall report's delay follow. ``report`` receives the
    stall lines (stderr by default). ``role`` (a split placement's ``train`` or ``rollout``) is
    named with the rank in every report, this rank's and its peers'.
    """

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        timeout_s: float,
        store: Store | None,
        report: Callable[[str], None] = _report_to_stderr,
        role: str | None = None,
    ) -> None:
        self.rank = rank
        self.role = role
        self.who = _who(rank, role)
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.store = store
        self.report = report
        self.step = 0
        self._stack: list[str] = []
        self._beat = 0
        self._state = RUNNING
        self._lock = threading.Lock()
        self._started_at = time.monotonic()
        self._seen: dict[int, tuple[bytes, float]] = {}
        self._stalled: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def for_default_group(cls, timeout_s: float) -> PhaseWatch:
        """A watch over the default process group (rank 0 of 1 when none is initialised)."""
        initialised = dist.is_initialized()
        return cls(
            rank=dist.get_rank() if initialised else 0,
            world_size=dist.get_world_size() if initialised else 1,
            timeout_s=timeout_s,
            store=_default_store(),
        )

    @property
    def phase_name(self) -> str:
        return self._stack[-1] if self._stack else "startup"

    def begin_step(self, step: int) -> None:
        """The iteration now running (1-based, as in ``metrics.jsonl``)."""
        self.step = step

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Run the block as phase ``name``; a collective timeout inside it is raised as a
        :class:`CollectiveTimeout` naming this rank, the phase, the step and the peers."""
        self._stack.append(name)
        # Published now, not at the next beat: a rank stopped right after entering a phase is
        # then reported in it, not in the one before.
        self._publish_quietly()
        try:
            yield
        except CollectiveTimeout:
            raise
        except BaseException as error:
            if not is_collective_timeout(error):
                raise
            raise self.timeout_error(error) from error
        finally:
            self._stack.pop()

    def timeout_error(self, error: BaseException) -> CollectiveTimeout:
        backend = " ".join(str(error).split())[:300]
        return CollectiveTimeout(
            f"{self.who}: a collective did not complete within {self.timeout_s:g} s "
            f"(--collective_timeout_s) in {_where(self.phase_name, self.step)}; "
            f"{self._peers_summary()}; the backend said: {backend}"
        )

    def _peers_summary(self) -> str:
        if self.world_size == 1:
            return "no other rank"
        try:
            peers = self.peers()
        except Exception as error:  # the store is gone too: say so, do not hide the timeout
            return f"the other ranks' phases are unknown ({type(error).__name__})"
        if not peers:
            return "the other ranks' phases are unknown (no store)"
        return "; ".join(peer.describe() for peer in peers)

    # --- publishing and reading -------------------------------------------------------------

    def start(self) -> None:
        """Publish now and then every :func:`heartbeat_interval_s` from a daemon thread (which
        ends with :meth:`close`, or once nothing refers to this watch any more)."""
        if self.store is None or self.world_size == 1 or self._thread is not None:
            return
        self._publish()
        interval = heartbeat_interval_s(self.timeout_s)
        self._thread = threading.Thread(
            target=_beat_until_stopped,
            args=(weakref.ref(self), self._stop, interval),
            name=f"lrft-phase-watch-rank{self.rank}",
            daemon=True,
        )
        self._thread.start()

    def close(self, *, failed: bool = False) -> None:
        """Stop beating and publish that this rank finished (or failed), so that its silence
        is not reported as a stall."""
        self._stop.set()
        self._state = FAILED if failed else FINISHED
        self._publish_quietly()

    def _publish_quietly(self) -> None:
        if self._thread is not None:
            # the store may be gone with the job: then there is nobody left to tell
            with contextlib.suppress(Exception):
                self._publish()

    def _publish(self) -> None:
        assert self.store is not None
        with self._lock:  # the thread and close() both publish
            self._beat += 1
            value = {
                "beat": self._beat,
                "phase": self.phase_name,
                "step": self.step,
                "role": self.role,
            }
            text = json.dumps({**value, "state": self._state})
        self.store.set(HEARTBEAT_KEY.format(rank=self.rank), text)

    def peers(self) -> list[PeerState]:
        """Every other rank's last published phase and how long its beat has been unchanged
        (since this watch started, for a rank that has not published yet)."""
        if self.store is None:
            return []
        now = time.monotonic()
        found = []
        with self._lock:
            for peer in range(self.world_size):
                if peer == self.rank:
                    continue
                key = HEARTBEAT_KEY.format(rank=peer)
                raw = self.store.get(key) if self.store.check([key]) else b""
                last = self._seen.get(peer)
                if last is None or last[0] != raw:
                    last = (raw, now if raw else self._started_at)
                    self._seen[peer] = last
                value: dict[str, Any] = json.loads(raw) if raw else {"phase": "startup", "step": 0}
                found.append(
                    PeerState(
                        rank=peer,
                        phase=str(value["phase"]),
                        step=int(value["step"]),
                        state=str(value.get("state", RUNNING)),
                        silent_s=now - last[1],
                        role=value.get("role"),
                    )
                )
        return found

    def _tick(self) -> None:
        self._publish()
        limit = stall_after_s(self.timeout_s)
        for peer in self.peers():
            silent = peer.state == RUNNING and peer.silent_s > limit
            if silent and peer.rank not in self._stalled:
                self._stalled.add(peer.rank)
                self.report(
                    f"lrft: {self.who}: {peer.who} has not been heard from for "
                    f"{peer.silent_s:.0f} s (its last report: {_where(peer.phase, peer.step)}; "
                    f"{self.who} is in {_where(self.phase_name, self.step)}): it is stopped, "
                    f"dead or stuck; collectives fail after {self.timeout_s:g} s "
                    "(--collective_timeout_s)"
                )
            elif not silent and peer.rank in self._stalled:
                self._stalled.discard(peer.rank)
                self.report(f"lrft: {self.who}: {peer.who} is heard from again")


def _beat_until_stopped(
    watch_ref: weakref.ref[PhaseWatch], stop: threading.Event, interval: float
) -> None:
    while not stop.wait(interval):
        watch = watch_ref()
        if watch is None:
            return
        try:
            watch._tick()
        except Exception as error:  # the store went away: the job is ending or already gone
            watch.report(
                f"lrft: rank {watch.rank}: the phase watch stopped ({type(error).__name__}: "
                f"{error})"
            )
            return
        finally:
            del watch
