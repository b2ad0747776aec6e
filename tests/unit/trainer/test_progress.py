"""Rank 0's console: a bar only on a terminal and when asked, one readable line per step
otherwise; the bar reaches the total, also when a resumed run starts it part-way."""

from __future__ import annotations

import importlib
import io
import os
from collections.abc import Iterator
from types import ModuleType

import pytest

from lrft.run.progress import (
    QUIET_ENVIRONMENT,
    Console,
    library_bars_allowed,
    phase_seconds,
    silence_library_bars,
    step_line,
    step_summary,
    use_progress_bar,
)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _metrics(step: int) -> dict[str, float]:
    return {
        "train/reward_mean": step / 10,
        "train/accuracy": step / 20,
        "train/response_length": 4.0 + step,
        "time/generate_s": 0.25 * step,
        "time/policy_s": 0.5,
        "time/weight_sync_s": 0.01,
        "time/step_s": 9.0,
        "memory/policy_mb": 100.0,
    }


@pytest.mark.parametrize(
    ("stream", "requested", "expected"),
    [
        (Terminal(), True, True),
        (Terminal(), False, False),
        (io.StringIO(), True, False),  # a pipe or log file
        (io.StringIO(), False, False),
    ],
)
def test_the_bar_needs_a_terminal_and_the_setting(
    stream: io.StringIO, requested: bool, expected: bool
) -> None:
    assert use_progress_bar(requested, stream) is expected


def test_a_stream_without_isatty_is_no_terminal() -> None:
    class Bare:
        def write(self, text: str) -> int:
            return len(text)

    assert use_progress_bar(True, Bare()) is False  # type: ignore[arg-type]  # duck-typed stream


def test_on_a_terminal_the_bar_advances_to_the_total_from_a_resumed_step() -> None:
    terminal = Terminal()
    console = Console(enabled=True, progress_bar=True, stream=terminal)
    console.start(total=5, initial=2)
    assert console.bar is not None
    for step in (3, 4, 5):
        console.step(step, 5, _metrics(step), elapsed=float(step))
        assert console.bar.n == step
        assert console.bar.postfix == step_summary(_metrics(step))
    console.say("eval at step 5: accuracy 0.500")
    console.close()

    text = terminal.getvalue()
    assert "5/5" in text
    assert "\r" in text  # redrawn in place
    assert "reward 0.500 acc 0.250 generate 1.25s" in text  # step 5's, with its slowest phase
    assert "eval at step 5: accuracy 0.500\n" in text
    assert "step 5/5  reward" not in text  # no plain lines while the bar is drawn


@pytest.mark.parametrize(
    "console",
    [
        Console(enabled=True, progress_bar=True, stream=io.StringIO()),  # not a terminal
        Console(enabled=True, progress_bar=False, stream=Terminal()),  # --no-progress_bar
    ],
    ids=["pipe", "switched-off"],
)
def test_without_a_bar_each_step_is_one_plain_line(console: Console) -> None:
    console.start(total=3, initial=0)
    assert console.bar is None
    for step in (1, 2, 3):
        console.step(step, 3, _metrics(step), elapsed=2.0 * step)
    console.say("checkpoint out/global_step3")
    console.close()

    assert isinstance(console.stream, io.StringIO)
    lines = console.stream.getvalue().splitlines()
    assert lines == [step_line(s, 3, _metrics(s), 2.0 * s) for s in (1, 2, 3)] + [
        "checkpoint out/global_step3"
    ]
    assert lines[2] == "step 3/3  reward 0.300  accuracy 0.150  length 7.0  9.0s  elapsed 6s"
    assert "\r" not in console.stream.getvalue()


def test_other_ranks_print_nothing() -> None:
    terminal = Terminal()
    console = Console(enabled=False, progress_bar=True, stream=terminal)
    console.start(total=3, initial=0)
    console.step(1, 3, _metrics(1), elapsed=1.0)
    console.say("hello")
    console.close()
    assert console.bar is None
    assert terminal.getvalue() == ""


def test_the_summary_names_the_slowest_phase() -> None:
    assert step_summary(_metrics(1)) == "reward 0.100 acc 0.050 policy 0.50s"
    assert step_summary(_metrics(4)) == "reward 0.400 acc 0.200 generate 1.00s"


def test_phase_seconds_leaves_out_the_whole_step() -> None:
    assert phase_seconds(_metrics(2)) == {"generate": 0.5, "policy": 0.5, "weight_sync": 0.01}


@pytest.mark.parametrize(
    ("rank", "requested", "stream", "expected"),
    [
        (0, True, Terminal(), True),
        (1, True, Terminal(), False),  # another rank: its bars would interleave with rank 0's
        (0, False, Terminal(), False),  # --no-progress_bar silences every bar
        (0, True, io.StringIO(), False),  # stderr redirected to a log
    ],
)
def test_library_bars_only_where_a_bar_can_be_read(
    rank: int, requested: bool, stream: io.StringIO, expected: bool
) -> None:
    assert library_bars_allowed(rank=rank, requested=requested, stream=stream) is expected


@pytest.fixture
def silenced(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """:func:`silence_library_bars` in this process, undone afterwards; yields ``datasets``."""
    datasets = importlib.import_module("datasets")  # optional and untyped
    from huggingface_hub.utils.tqdm import are_progress_bars_disabled, enable_progress_bars
    from tqdm import std
    from transformers.utils import logging

    for name in QUIET_ENVIRONMENT:
        monkeypatch.setenv(name, "0")  # recorded, so the test's values are removed afterwards
    monkeypatch.setattr(std.tqdm, "__init__", std.tqdm.__dict__["__init__"])  # restored after
    hub_was_on = not are_progress_bars_disabled()
    transformers_was_on = logging.is_progress_bar_enabled()
    datasets_was_on = datasets.is_progress_bar_enabled()
    silence_library_bars()
    yield datasets
    if hub_was_on:
        enable_progress_bars()
    if transformers_was_on:
        logging.enable_progress_bar()  # type: ignore[no-untyped-call]  # unannotated there
    if datasets_was_on:
        datasets.enable_progress_bars()


def test_silenced_library_bars_draw_nothing(silenced: ModuleType) -> None:
    # The bars that reached a redirected log: transformers' loading and export bars, and the
    # plain tqdm the GGUF conversion of the smollm2 preset uses; datasets' and the hub's too.
    from huggingface_hub.utils.tqdm import tqdm as hub_tqdm
    from transformers.utils import logging

    gguf = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
    for name, value in QUIET_ENVIRONMENT.items():
        assert os.environ[name] == value
    for make in (logging.tqdm, gguf.tqdm, hub_tqdm):
        sink = Terminal()
        for _ in make(range(3), desc="Loading weights", file=sink):
            pass
        assert sink.getvalue() == "", make
    assert silenced.is_progress_bar_enabled() is False
    # lrft's own bar is decided by the Console, not vetoed by TQDM_DISABLE
    terminal = Terminal()
    console = Console(enabled=True, progress_bar=True, stream=terminal)
    console.start(total=2, initial=0)
    console.step(1, 2, _metrics(1), elapsed=1.0)
    console.close()
    assert "\r" in terminal.getvalue()
