"""``lrft bench``: the benchmark command line. One argument per :class:`BenchSettings` field.

Runs as one process (``lrft bench ...``, ``python -m lrft bench ...``) or under torchrun
(``torchrun --nproc_per_node N -m lrft bench ...``); settings and the workload file are
validated before any process group starts.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import attrs

from lrft.api.errors import ConfigError, LrftError
from lrft.bench.grpo import check_train_settings
from lrft.bench.run import DEFAULT_WORKLOADS, MODES, BenchSettings
from lrft.bench.workloads import BUILT_IN, load_workload
from lrft.cli.launch import command_parser, single_process_env

DESCRIPTION = (
    "Throughput of lrft's trainer components on a fixed workload, against ceilings measured in "
    "the same run; writes a JSON document and prints a table. Modes: grpo (end-to-end GRPO "
    "through lrft train's own trainer, per phase), train-mfu (the policy update alone), sync "
    "(weight sync into the engine), sleep (engine sleep levels), all (every part the workload "
    "defines). docs/benchmarks.md explains each figure."
)


def add_bench_parser(commands: Any) -> argparse.ArgumentParser:
    """Add ``bench`` to the ``lrft`` sub-command parsers."""
    defaults = ", ".join(f"{mode}: {name}" for mode, name in DEFAULT_WORKLOADS.items())
    parser: argparse.ArgumentParser = commands.add_parser(
        "bench", help="benchmark the trainer's components", description=DESCRIPTION
    )
    parser.add_argument(
        "mode", nargs="?", default="all", choices=MODES, help="which part to run (default: all)"
    )
    parser.add_argument(
        "--workload",
        metavar="NAME|FILE",
        help=f"a built-in workload ({', '.join(BUILT_IN)}) or a workload JSON file "
        f"(default by mode: {defaults})",
    )
    parser.add_argument(
        "--output",
        metavar="FILE",
        help="where rank 0 writes the JSON document (default: lrft_bench/WORKLOAD-MODE.json)",
    )
    parser.add_argument(
        "--work_dir",
        metavar="DIR",
        help="where the random-weight model folder and prompt file are written and reused "
        "(default: TMPDIR/lrft-bench)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        metavar="N",
        help="run N GRPO steps (the steady window clipped to them) and N timed training steps "
        "instead of the workload's",
    )
    return parser


def build_bench_parser() -> argparse.ArgumentParser:
    return command_parser(add_bench_parser)


def settings_from_args(argv: Sequence[str]) -> BenchSettings:
    """``lrft bench ...`` arguments (``argv`` starts with ``bench``) as validated settings; the
    workload file is read and checked too, so a bad one fails before anything starts."""
    args = vars(build_bench_parser().parse_args(list(argv)))
    args.pop("command")
    names = {field.name for field in attrs.fields(BenchSettings)}
    assert set(args) == names, sorted(set(args) ^ names)
    settings = BenchSettings(**args)
    workload = load_workload(settings.workload_name)
    parts = settings.parts(workload)
    if "grpo" in parts:
        assert workload.grpo is not None
        check_train_settings(workload.grpo, world_size=int(os.environ.get("WORLD_SIZE", "1")))
    return settings


def bench_main(argv: Sequence[str]) -> int:
    from lrft.bench.run import run

    try:
        settings = settings_from_args(argv)
    except ConfigError as error:
        print(f"lrft bench: configuration error: {error}", file=sys.stderr)
        return 2
    single_process_env(any_port=True)
    try:
        run(settings)
    except ConfigError as error:
        print(f"lrft bench: configuration error: {error}", file=sys.stderr, flush=True)
        return 2
    except LrftError as error:
        print(f"lrft bench failed: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        raise
    return 0
