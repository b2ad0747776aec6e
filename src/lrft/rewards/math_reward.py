"""Math answer verification with math-verify, isolated in a worker process with a hard deadline.

math-verify (the ``math-verify`` package) parses LaTeX and plain answers into sympy and decides
symbolic equality (``\\frac{1}{2}`` equals ``0.5``, ``x = 5`` equals ``5``). sympy can take
unbounded time and memory on a pathological answer (``9^{9^{9}}``), so the parsing and comparing
run in a child process: past ``timeout_s`` it is killed and replaced, which stops even work stuck
in C code; a memory limit turns an absurd number into an error there. math-verify's own timeout
uses ``SIGALRM``, which works only in the main thread and would cancel any other alarm the
process relies on; the worker needs neither.
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from lrft.api.validators import finite, non_negative, positive_number
from lrft.rewards._checks import name_validator
from lrft.rewards.answers import ANSWER_FORMATS, AnswerFormat, extract_answer, reference_answer
from lrft.rewards.base import RewardError, RewardOutput, RewardSample

_WORKER_SCRIPT = Path(__file__).with_name("_verify_worker.py")
_INSTALL_HINT = "pip install 'math-verify[antlr4_13_2]'"


def _kill(process: subprocess.Popen[bytes], owner_pid: int) -> None:
    if os.getpid() != owner_pid:
        return  # a forked child (a data-loader worker) must not stop its parent's worker
    if process.poll() is None:
        process.kill()
    process.wait()
    for stream in (process.stdin, process.stdout):
        if stream is not None:
            stream.close()


class _Worker:
    """One worker process at a time, started on first use and replaced after a timeout."""

    def __init__(self, *, reward: str, memory_limit_bytes: int, start_timeout_s: float) -> None:
        self._reward = reward
        self._memory_limit_bytes = memory_limit_bytes
        self._start_timeout_s = start_timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._pending = b""
        self._lock = threading.Lock()

    def _start(self) -> subprocess.Popen[bytes]:
        # -P: the script's folder (this package) must not shadow modules the worker imports.
        process = subprocess.Popen(
            [sys.executable, "-P", str(_WORKER_SCRIPT), str(self._memory_limit_bytes)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._process, self._pending = process, b""
        self._finalizer = weakref.finalize(self, _kill, process, os.getpid())
        reply = self._read_reply(process, self._start_timeout_s)
        if reply != {"ready": True}:
            self.stop()
            raise RewardError(
                reward=self._reward,
                detail=f"the math-verify worker did not start (got {reply!r}; see its stderr "
                f"above); is math-verify installed? {_INSTALL_HINT}",
            )
        return process

    def stop(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # kills the process once, whether called here or at collection
        self._process, self._finalizer = None, None

    def _read_reply(
        self, process: subprocess.Popen[bytes], timeout_s: float
    ) -> dict[str, Any] | None:
        """The next JSON line, ``{"exited": code}`` if the worker died, None past the deadline."""
        assert process.stdout is not None
        descriptor = process.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([descriptor], [], [], remaining)[0]:
                return None
            chunk = os.read(descriptor, 1 << 16)
            if not chunk:
                return {"exited": process.wait()}
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        reply: dict[str, Any] = json.loads(line)
        return reply

    def request(self, payload: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
        """The worker's reply; None when it timed out (the worker is then killed)."""
        with self._lock:
            process = self._process
            if process is None or process.poll() is not None:
                self.stop()
                process = self._start()
            assert process.stdin is not None
            try:
                process.stdin.write(json.dumps(payload).encode() + b"\n")
                process.stdin.flush()
            except BrokenPipeError:
                self.stop()
                return {"exited": process.wait()}
            reply = self._read_reply(process, timeout_s)
            if reply is None or "exited" in reply:
                self.stop()
            return reply


@attrs.frozen(kw_only=True, eq=False)
class MathVerifyReward:
    """1.0 when the response's final answer equals the sample's reference, else 0.0.

    The answer is the last ``\\boxed{...}`` or GSM8K ``#### ...`` of the response (``formats``,
    tried in order); the reference is either a worked solution in the same formats or a plain
    answer. Equality is math-verify's: numeric within ``float_rounding`` digits, symbolic,
    sets, intervals, equations.

    A response with no answer, one that takes longer than ``timeout_s`` to judge, or one whose
    judging raises (an absurd number past ``memory_limit_bytes`` of address space in the worker,
    0 for no limit) scores 0; the metrics ``extracted``, ``timeout`` and ``error`` tell them
    apart. A sample without a reference, or whose reference math-verify cannot parse, raises
    :class:`RewardError` naming the sample: that is a data problem, and scoring it 0 would hide
    it. (A time-out is blamed on the response: references come from curated data.)

    The worker process starts on the first call (a few tenths of a second) and is stopped by
    :meth:`close`, at exit or when the reward is garbage-collected. Calls are serialised.
    """

    name: str = attrs.field(default="math", validator=name_validator)
    timeout_s: float = attrs.field(default=5.0, validator=[finite, positive_number])
    formats: tuple[AnswerFormat, ...] = attrs.field(default=ANSWER_FORMATS, converter=tuple)
    float_rounding: int = 6
    numeric_precision: int = 15
    strict: bool = True
    memory_limit_bytes: int = attrs.field(default=4 << 30, validator=non_negative)
    start_timeout_s: float = attrs.field(default=60.0, validator=[finite, positive_number])
    _worker: _Worker = attrs.field(
        init=False,
        repr=False,
        default=attrs.Factory(
            lambda self: _Worker(
                reward=self.name,
                memory_limit_bytes=self.memory_limit_bytes,
                start_timeout_s=self.start_timeout_s,
            ),
            takes_self=True,
        ),
    )

    def __attrs_post_init__(self) -> None:
        unknown = [f for f in self.formats if f not in ANSWER_FORMATS]
        if not self.formats or unknown:
            raise ValueError(
                f"formats must be a non-empty selection of {list(ANSWER_FORMATS)}, "
                f"got {list(self.formats)!r}"
            )
        if importlib.util.find_spec("math_verify") is None:
            raise ImportError(f"MathVerifyReward needs the math-verify package: {_INSTALL_HINT}")

    def close(self) -> None:
        """Stop the worker process; a later call starts a new one."""
        self._worker.stop()

    def __enter__(self) -> MathVerifyReward:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __call__(self, samples: Sequence[RewardSample]) -> RewardOutput:
        scores: list[float] = []
        metrics: dict[str, list[float]] = {"extracted": [], "timeout": [], "error": []}
        for index, sample in enumerate(samples):
            score, extracted, timed_out, failed = self._judge(index, sample)
            scores.append(score)
            metrics["extracted"].append(float(extracted))
            metrics["timeout"].append(float(timed_out))
            metrics["error"].append(float(failed))
        return RewardOutput(scores=scores, metrics=metrics)

    def _judge(self, index: int, sample: RewardSample) -> tuple[float, bool, bool, bool]:
        """(score, extracted, timed out, failed) for one sample."""
        if sample.reference is None:
            raise RewardError(
                reward=self.name, sample_index=index, detail="the sample has no reference answer"
            )
        gold = reference_answer(sample.reference, self.formats)
        if not gold:
            raise RewardError(reward=self.name, sample_index=index, detail="the reference is empty")
        answer = extract_answer(sample.response, self.formats)
        if answer is None:
            return 0.0, False, False, False
        payload = {
            "gold": gold,
            "answer": answer,
            "float_rounding": self.float_rounding,
            "numeric_precision": self.numeric_precision,
            "strict": self.strict,
        }
        reply = self._worker.request(payload, self.timeout_s)
        if reply is None:
            return 0.0, True, True, False
        if "exited" in reply or reply.get("stage") == "answer":
            # The worker died (the OS killed it) or judging this answer raised: the answer's
            # fault as far as can be told, like a timeout.
            return 0.0, True, False, True
        if "error" in reply or not reply["gold_parsed"]:
            cause = f"raised {reply['error']}" if "error" in reply else "gave nothing"
            raise RewardError(
                reward=self.name,
                sample_index=index,
                detail=f"parsing the reference answer {gold!r} with math-verify {cause}",
            )
        return (1.0 if reply["correct"] else 0.0), True, False, False
