"""One step window and one median on both sides of a side-by-side benchmark: ``lrft bench``'s
GRPO summary and the TRL scripts' summary, fed the same step times, report the same steady
steps and the same median, and that median is the textbook one."""

from __future__ import annotations

import statistics
from pathlib import Path

import attrs
import pytest
import torch

from lrft.bench.grpo import _config, _summary
from lrft.bench.steps import median, steady_median, steady_window
from lrft.bench.trl_side import GenerationProbe, LoopTimer, TrlRun, summary
from lrft.bench.workloads import load_workload

# an even steady window (steps 2-5 of 5), whose upper middle (4.0) is not its median (3.5)
SECONDS = [9.0, 5.0, 3.0, 4.0, 1.0]


def test_the_median_and_window_by_hand() -> None:
    assert steady_window(SECONDS, 2) == [5.0, 3.0, 4.0, 1.0]
    assert median([5.0, 3.0, 4.0, 1.0]) == 3.5  # the mean of the two middle values
    assert steady_median(SECONDS, 3) == 3.0
    assert steady_median(SECONDS, 2) == statistics.median(SECONDS[1:])
    assert steady_window(SECONDS, 9) == SECONDS  # a run shorter than its warm-up: every step
    assert median([]) == 0.0
    with pytest.raises(ValueError, match="1-based"):
        steady_window(SECONDS, 0)


def _lrft_median(seconds: list[float], steady_from: int) -> tuple[float, list[int]]:
    workload = load_workload("tiny")
    assert workload.grpo is not None
    spec = workload.grpo
    config = _config(spec, pretrain="m", prompt_data="p", save_path="o", steps=len(seconds))
    metrics = {"train/response_length": 8.0, "train/reward_mean": 0.0, "time/generate_s": 0.1}
    records = [(s, metrics) for s in seconds]
    done = _summary(workload, spec, config, 1, records, steady_from, 1.0)
    return done["step_seconds_median"], done["steady_steps"]


def _trl_median(seconds: list[float], steady_from: int, tmp_path: Path) -> tuple[float, list[int]]:
    base = load_workload("tiny")
    assert base.grpo is not None
    workload = attrs.evolve(base, grpo=attrs.evolve(base.grpo, steady_from=steady_from))
    run = TrlRun(
        workload=workload, generation="generate", precision="bf16", steps=len(seconds),
        output=tmp_path / "trl.json", work_dir=tmp_path,
    )  # fmt: skip
    device = torch.device("cpu")
    probe = GenerationProbe(torch.nn.Linear(1, 1), device, eos=0, draw=None)
    timer = LoopTimer(device, probe, after_step=lambda: None)
    timer.loop = list(seconds)
    timer.window = [s / 2 for s in seconds]
    timer.calls = [range(0) for _ in seconds]
    timer.rest_peaks = [None for _ in seconds]
    done = summary(run, timer, probe, {"device_type": "cpu"})
    assert done["callback_step_seconds_median"] == steady_median(timer.window, steady_from)
    return done["step_seconds_median"], done["steady_steps"]


@pytest.mark.parametrize("steady_from", [1, 2, 3])
def test_both_sides_take_the_same_median_of_the_same_steps(
    steady_from: int, tmp_path: Path
) -> None:
    lrft = _lrft_median(SECONDS, steady_from)
    trl = _trl_median(SECONDS, steady_from, tmp_path)
    assert lrft == trl
    assert lrft[0] == statistics.median(SECONDS[steady_from - 1 :])
    assert lrft[1] == list(range(steady_from, len(SECONDS) + 1))
