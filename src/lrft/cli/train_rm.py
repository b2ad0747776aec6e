"""``lrft train-rm``: reward-model training from the command line, one flag per
:class:`~lrft.rm.RMTrainConfig` field of the same name (its docstring the help, its metadata the
section of ``--help``, :mod:`lrft.cli.flags`).

Runs as one process (``lrft train-rm ...``) or under torchrun (``torchrun --nproc_per_node N -m
lrft train-rm ...``). ``--config`` reads a JSON or YAML file of the same keys (the command line
wins). The config, the model folder and every row of the data are checked before any process
group starts.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lrft.api.errors import ConfigError, LrftError
from lrft.cli.config_file import read_keys
from lrft.cli.flags import Flag, add_grouped_flags, flags_of
from lrft.cli.launch import command_parser, single_process_env
from lrft.rm.config import RMFlagGroup, RMTrainConfig
from lrft.rm.demo import DEMO_RM_SETTINGS

DESCRIPTION = (
    "Train a reward model. Scalar (default): Bradley-Terry on preference pairs (prompt, chosen, "
    "rejected, optional margin), exported as a one-label sequence-classification folder that "
    "lrft train --reward_pretrain loads. Generative (--generative): supervised training of a judge "
    "on (prompt, response, verdict) rows rendered with a judge template, exported as a causal-LM "
    "folder that lrft train --grm_pretrain judges with. Process (--step_separator TEXT): a "
    "one-label token-classification head learns each step's label at the step's last token, "
    "exported as the folder lrft train --prm_pretrain loads. With no --pretrain: the built-in demo "
    "(a scalar RM on the demo model, from synthetic addition preferences). docs/reward-models.md."
)


RM_FLAGS: tuple[Flag, ...] = flags_of(RMTrainConfig)
"""``lrft train-rm``'s flags, one per :class:`RMTrainConfig` field."""


def add_train_rm_parser(commands: Any) -> argparse.ArgumentParser:
    """Add ``train-rm`` to the ``lrft`` sub-command parsers."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "train-rm",
        help="train a scalar or generative reward model",
        description=DESCRIPTION,
        allow_abbrev=False,
    )
    parser.add_argument(
        "--config", type=Path, default=None, help="a JSON or YAML file of these same keys"
    )
    add_grouped_flags(parser, RM_FLAGS, RMFlagGroup, [("demo", DEMO_RM_SETTINGS)])
    return parser


def config_from_args(argv: Sequence[str]) -> RMTrainConfig:
    """``lrft train-rm ...`` arguments (``argv`` starts with ``train-rm``) as a validated config."""
    args = vars(command_parser(add_train_rm_parser).parse_args(list(argv)))
    args.pop("command")
    config_file = args.pop("config")
    values = (
        read_keys(config_file, {flag.name for flag in RM_FLAGS}) if config_file is not None else {}
    )
    values.update(args)
    if values.get("pretrain") is None:
        values = {**DEMO_RM_SETTINGS, **values}
    try:
        return RMTrainConfig(**values)
    except TypeError as error:  # a value of the wrong type in a config file
        raise ConfigError(f"invalid configuration: {error}") from error


def train_rm_main(argv: Sequence[str]) -> int:
    rank = os.environ.get("RANK", "0")
    try:
        config = config_from_args(argv)
        config.validate_world(int(os.environ.get("WORLD_SIZE", "1")))
    except ConfigError as error:
        print(f"lrft train-rm: configuration error: {error}", file=sys.stderr)
        return 2
    single_process_env(any_port=True)
    from lrft.rm.build import build_rm_trainer

    try:
        result = build_rm_trainer(config).fit()
    except ConfigError as error:
        print(
            f"lrft train-rm: rank {rank}: configuration error: {error}", file=sys.stderr, flush=True
        )
        return 2
    except (LrftError, RuntimeError, OSError) as error:
        print(
            f"lrft train-rm: rank {rank} failed: {type(error).__name__}: {error}",
            file=sys.stderr,
            flush=True,
        )
        raise
    if rank == "0":
        print(result.summary(), flush=True)
    return 0
