"""``lrft train``: the command line (LightRFT's flag names) and its torchrun entry point; the
other commands (``lrft eval``, ``lrft train-rm``, ``lrft bench``) have modules of their own.

Every flag maps to one :class:`~lrft.config.TrainConfig` field of the same name
(:mod:`lrft.cli.flags`); ``--config`` reads a JSON or YAML file of the same keys (the command
line wins). The config is built and validated (including the world-size rules, read from
torchrun's environment, and the model folders, prompt files and credential variables it names)
before any process group starts.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lrft.api.errors import CollectiveTimeout, ConfigError, LrftError
from lrft.backends import registry
from lrft.backends.registry import import_plugins
from lrft.cli.bench import add_bench_parser, bench_main
from lrft.cli.config_file import read_keys
from lrft.cli.eval import add_eval_parser, eval_main
from lrft.cli.flags import FLAGS, FlagGroup, add_grouped_flags, translate_names
from lrft.cli.launch import SuggestingParser, single_process_env
from lrft.cli.lightrft import translate
from lrft.cli.train_rm import add_train_rm_parser, train_rm_main
from lrft.config import TrainConfig
from lrft.config.problems import gathering
from lrft.config.validators import plugin_modules
from lrft.demos import DEMO_CRITIC_SETTINGS, DEMO_LORA_SETTINGS, DEMO_SETTINGS
from lrft.demos.vision.settings import VISION_DEMO_SETTINGS
from lrft.dist.init import close_distributed
from lrft.redaction import redact
from lrft.run.progress import library_bars_allowed, silence_library_bars

DESCRIPTION = (
    "lrft: reinforcement fine-tuning (GRPO, PPO and their variants) of Hugging Face models, on "
    "one process or under torchrun. Each command lists its own flags: lrft COMMAND --help."
)
DEMO_VARIANTS = (
    ("demo", DEMO_SETTINGS),
    ("demo with gae", DEMO_CRITIC_SETTINGS),
    ("demo with --lora_rank", DEMO_LORA_SETTINGS),
    ("vision demo", VISION_DEMO_SETTINGS),
)
"""The built-in demos' settings, each shown in ``--help`` where it differs from the default."""

_DECIMAL = r"(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|inf|infinity|nan"
NEGATIVE_NUMBERS = re.compile(rf"^-({_DECIMAL})(,[-+]?({_DECIMAL}))*$", re.IGNORECASE)
"""A negative number, exponent included, or a comma-separated list that starts with one
(``--reward_weights -1,2``). argparse (3.11, 3.12) takes ``-1e-4`` for an option and refuses
``--actor_learning_rate -1e-4`` with its own message; with this matcher the value parses and
the config validator names the rule it breaks."""


def build_parser() -> argparse.ArgumentParser:
    parser = SuggestingParser(prog="lrft", description=DESCRIPTION)
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser(
        "train",
        # no prefixes: LightRFT's --fsdp would be an ambiguous prefix of lrft's --fsdp_* flags,
        # and its --eval_data a silent abbreviation of --eval_dataset (lrft.cli.lightrft)
        allow_abbrev=False,
        usage="%(prog)s [-h] [--config FILE] [--FLAG VALUE ...]",
        help="RL fine-tuning under torchrun; with no --pretrain, the built-in demo",
        description="Colocated RL fine-tuning (fsdp2 trainer + hf engine + direct weight sync). "
        "With no --pretrain it trains the built-in demo (a tiny model learning addition). "
        "Each flag shows its default, and the demo's where the demo sets another.",
    )
    train._negative_number_matcher = NEGATIVE_NUMBERS
    train.add_argument(
        "--config", type=Path, default=None, help="a JSON or YAML file of these same keys"
    )
    add_grouped_flags(train, FLAGS, FlagGroup, DEMO_VARIANTS)
    add_bench_parser(commands)  # listed in `lrft --help`; `lrft bench` is parsed by bench_main
    add_train_rm_parser(commands)  # likewise: `lrft train-rm` is parsed by train_rm_main
    add_eval_parser(commands)
    return parser


def read_config_file(path: Path) -> dict[str, Any]:
    """A mapping of TrainConfig keys from a JSON (``.json``) or YAML file."""
    return read_keys(path, {flag.name for flag in FLAGS})


def config_from_args(argv: Sequence[str]) -> TrainConfig:
    """Parse ``lrft train ...`` arguments into a validated config (no process group needed)."""
    from lrft.demos import demo_settings
    from lrft.presets import preset_settings

    argv = list(argv)
    if argv[:1] == ["train"]:
        import_plugins(_plugins_named(argv[1:]))  # before the parser lists what they register
        known = translate_names(FLAGS, registry.entries("rollout"))
        argv = ["train", *translate(argv[1:], **known)]
    args = vars(build_parser().parse_args(argv))
    args.pop("command")
    config_file = args.pop("config")
    values = read_config_file(config_file) if config_file is not None else {}
    values.update(args)
    if values.get("preset") is not None:
        values = {**preset_settings(str(values["preset"])), **values}
    elif values.get("pretrain") is None:
        values = {**demo_settings(values), **values}
    try:
        return TrainConfig(**values)
    except TypeError as error:  # a value of the wrong type in a config file
        raise ConfigError(f"invalid configuration: {error}") from error


def _plugins_named(argv: Sequence[str]) -> tuple[str, ...]:
    """The ``plugins`` modules a command line (or its ``--config`` file) names."""
    names: list[str] = []
    for index, token in enumerate(argv):
        for flag in ("plugins", "config"):
            value = None
            if token.startswith(f"--{flag}="):
                value = token.split("=", 1)[1]
            elif token == f"--{flag}" and index + 1 < len(argv):
                value = argv[index + 1]
            if value is None:
                continue
            if flag == "config":
                value = read_config_file(Path(value)).get("plugins")
            if value is not None:
                names.extend(plugin_modules(value))
    return tuple(names)


def world_size_from_env() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


EXIT_CONFIG_ERROR = 2
"""``lrft train``'s exit code for a configuration error (under torchrun, see :func:`main`)."""
EXIT_COLLECTIVE_TIMEOUT = 3
"""``lrft train``'s exit code when a collective timed out (a rank stalled or died)."""


def _fail(line: str) -> None:
    """Print ``line`` (secrets hidden) and hand it to torchrun for its failure summary."""
    line = redact(line)
    print(line, file=sys.stderr, flush=True)
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")  # set by torchrun for each worker
    if error_file:
        # The format torchrun's error handler writes; its summary then shows this line as the
        # root cause instead of "To enable traceback see: ...".
        info = {"py_callstack": line, "timestamp": str(int(time.time()))}
        Path(error_file).write_text(json.dumps({"message": {"message": line, "extraInfo": info}}))


def main(argv: Sequence[str] | None = None) -> int:
    """``lrft`` from the command line; returns the exit code.

    A configuration error prints one line and returns 2; a collective timeout one line and 3;
    any other failure prints a line and raises (exit code 1, with the traceback). torchrun itself
    exits with 1 whenever a worker fails: the worker's own code is in its summary's ``Root Cause``
    (``exitcode : 2``), with the line printed here as its ``traceback``.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"bench": bench_main, "train-rm": train_rm_main, "eval": eval_main}
    code = commands.get(argv[0] if argv else "", _train_main)(argv)
    if code == 0:
        close_distributed()  # every rank got here: none exits while a peer still talks to it
    return code


def checked_config(argv: Sequence[str], world_size: int) -> TrainConfig:
    """The config of ``lrft train ...``, checked whole before any process group starts: its
    flags, its fields and the rules across them, the world size, the optional packages it
    needs, and the model folders, data files and templates it names. Raises one
    ``ConfigError`` listing every problem found."""
    from lrft.trainer.preflight import check_before_start

    with gathering() as problems:
        config = config_from_args(argv)
        problems.check(config.validate_world, world_size)
        if config.pretrain is not None:
            # else the demo or a preset fills it in, and the trainer checks it then
            problems.check(check_before_start, config)
    problems.raise_any()
    return config


def _train_main(argv: list[str]) -> int:
    rank = os.environ.get("RANK", "0")
    try:
        config = checked_config(argv, world_size_from_env())
    except ConfigError as error:
        _fail(f"lrft: configuration error: {error}")
        return EXIT_CONFIG_ERROR
    single_process_env()
    if not library_bars_allowed(rank=int(rank), requested=config.progress_bar, stream=sys.stderr):
        silence_library_bars()  # before any model, dataset or engine is loaded
    from lrft.demos.apply import apply_demo_or_preset
    from lrft.trainer.split_build import build_job

    try:
        prepared = apply_demo_or_preset(config, int(rank))
        # a config the demo or a preset left as it was is checked already (checked_config)
        trainer = build_job(prepared, checked=prepared is config)
        result = trainer.fit()
    except ConfigError as error:
        _fail(f"lrft: rank {rank}: configuration error: {error}")
        return EXIT_CONFIG_ERROR
    except CollectiveTimeout as error:
        _fail(f"lrft: {error}")
        return EXIT_COLLECTIVE_TIMEOUT
    except (LrftError, RuntimeError, OSError) as error:
        _fail(f"lrft: rank {rank} failed: {type(error).__name__}: {error}")
        raise
    if result.first_eval and result.last_eval and trainer.rank == 0:
        print(
            f"done: {result.steps} steps in {result.seconds:.0f}s; held-out accuracy "
            f"{result.first_eval['eval/accuracy']:.3f} -> {result.last_eval['eval/accuracy']:.3f}",
            flush=True,
        )
    return 0


__all__ = ["build_parser", "config_from_args", "main", "read_config_file"]
