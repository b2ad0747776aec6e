"""What rank 0 prints while training: a progress bar on a terminal, one line per step otherwise.

A bar redraws itself with carriage returns, which a log file or a pipe keeps as one unreadable
line; so the bar is drawn only when the stream is a terminal (and ``progress_bar`` is on), and
every other case prints one plain line per step. Messages (evaluations, checkpoints) go through
:meth:`Console.say`, which prints them above the bar instead of through it.

The libraries lrft runs draw bars of their own on stderr (transformers' "Loading weights" and
"Writing model shards", datasets' and the hub's, the GGUF conversion of the smollm2 preset,
vLLM's weight loading), on every rank. :func:`library_bars_allowed` lets them draw only where a
bar of lrft's own could be read: rank 0, ``progress_bar`` on, stderr a terminal;
:func:`silence_library_bars` turns them off everywhere else.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from tqdm import tqdm

PHASE_PREFIX = "time/"
PHASE_SUFFIX = "_s"
SLOWEST_PHASES_SHOWN = 1  # more makes the bar wider than a common 100-column terminal


def is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return callable(isatty) and bool(isatty())


def use_progress_bar(requested: bool, stream: TextIO) -> bool:
    """Whether to draw a bar on ``stream``: asked for, and ``stream`` is a terminal."""
    return requested and is_terminal(stream)


QUIET_ENVIRONMENT = {
    "TQDM_DISABLE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
}
"""The switches that turn library bars off: tqdm's own default (tqdm >= 4.66 reads ``TQDM_*``
variables at import; a caller's explicit ``disable=`` still wins, hence the vllm adapter
forwards it), and Hugging Face's, which transformers' bars follow. Child processes inherit
them."""


def library_bars_allowed(*, rank: int, requested: bool, stream: TextIO) -> bool:
    """Whether libraries may draw their bars on ``stream`` (their stderr) on this rank."""
    return rank == 0 and requested and is_terminal(stream)


def limit_library_bars(rank: int, *, requested: bool, stream: TextIO | None = None) -> None:
    """Leave the libraries' bars (transformers' "Loading weights", datasets' maps) to rank 0
    when ``requested`` and ``stream`` (stderr) is a terminal; silence them everywhere else.
    Call before loading anything."""
    shown_on = sys.stderr if stream is None else stream
    if not library_bars_allowed(rank=rank, requested=requested, stream=shown_on):
        silence_library_bars()


def silence_library_bars() -> None:
    """Turn library progress bars off in this process and the processes it starts.

    The variables reach modules imported later and child processes; a Hugging Face library
    already imported has read them at import, so its own switch is flipped too.
    """
    os.environ.update(QUIET_ENVIRONMENT)
    _disable_imported_tqdm()
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils.tqdm import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging

        logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # unannotated there
    if "datasets" in sys.modules:  # optional and untyped: reached through the loaded module
        sys.modules["datasets"].disable_progress_bars()


def _disable_imported_tqdm() -> None:
    # tqdm (>= 4.66) reads TQDM_* once, when it is imported, into keyword defaults of
    # tqdm.__init__ (a functools.partialmethod). lrft's own imports have imported it by now, so
    # the variable alone would reach child processes only: add the same default here. A
    # caller's explicit disable= still wins, as it does over TQDM_DISABLE.
    from tqdm import std

    init = std.tqdm.__dict__.get("__init__")
    if isinstance(init, functools.partialmethod):
        std.tqdm.__init__ = functools.partialmethod(  # type: ignore[method-assign, assignment]  # see above
            init.func, *init.args, **{**init.keywords, "disable": True}
        )


def phase_seconds(metrics: Mapping[str, float]) -> dict[str, float]:
    """The phases' wall times (``time/<phase>_s``), without the whole step's ``time/step_s``."""
    return {
        key[len(PHASE_PREFIX) : -len(PHASE_SUFFIX)]: value
        for key, value in metrics.items()
        if key.startswith(PHASE_PREFIX) and key.endswith(PHASE_SUFFIX) and key != "time/step_s"
    }


def step_summary(metrics: Mapping[str, float]) -> str:
    """Reward, accuracy and the slowest phase of one step, for the bar."""
    parts = [f"reward {metrics['train/reward_mean']:.3f}", f"acc {metrics['train/accuracy']:.3f}"]
    phases = sorted(phase_seconds(metrics).items(), key=lambda item: -item[1])
    parts += [f"{name} {seconds:.2f}s" for name, seconds in phases[:SLOWEST_PHASES_SHOWN]]
    return " ".join(parts)


def step_line(step: int, total: int, metrics: Mapping[str, float], elapsed: float) -> str:
    """The plain line printed for each step when there is no bar."""
    return (
        f"step {step}/{total}  reward {metrics['train/reward_mean']:.3f}  "
        f"accuracy {metrics['train/accuracy']:.3f}  "
        f"length {metrics['train/response_length']:.1f}  "
        f"{metrics['time/step_s']:.1f}s  elapsed {elapsed:.0f}s"
    )


class Console:
    """Rank 0's output; other ranks (``enabled=False``) print nothing.

    :meth:`start` opens the bar (from ``initial``, the step a resumed run starts at) when
    :func:`use_progress_bar` allows; :meth:`step` advances it to ``step`` with
    :func:`step_summary`, or prints :func:`step_line` when there is no bar. ``stream`` defaults
    to ``sys.stdout`` at each call.
    """

    def __init__(self, *, enabled: bool, progress_bar: bool, stream: TextIO | None = None) -> None:
        self.enabled = enabled
        self.progress_bar = progress_bar
        self._stream = stream
        self.bar: tqdm[Any] | None = None  # an iterator over nothing: updated by hand

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stdout

    def start(self, *, total: int, initial: int) -> None:
        if not self.enabled or self.bar is not None:
            return
        if use_progress_bar(self.progress_bar, self.stream):
            self.bar = tqdm(
                total=total,
                initial=initial,
                desc="train",
                unit="step",
                file=self.stream,
                dynamic_ncols=True,
                disable=False,  # decided above; TQDM_DISABLE (set for libraries) must not veto it
            )

    def step(self, step: int, total: int, metrics: Mapping[str, float], elapsed: float) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            self.say(step_line(step, total, metrics, elapsed))
            return
        self.bar.set_postfix_str(step_summary(metrics), refresh=False)
        self.bar.update(step - self.bar.n)

    def say(self, message: str) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            print(message, file=self.stream, flush=True)
        else:
            self.bar.write(message, file=self.stream)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
