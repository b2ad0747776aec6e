"""What a command line needs to know of a config field beyond its name, type, default and
docstring: the section of ``--help`` that lists it, and how argparse reads its value.

A field carries it as ``attrs.field(..., metadata=flag(FlagGroup.ROLLOUT))``; :mod:`lrft.cli.flags`
builds each command's parser from the fields, with the field's docstring as the flag's help, so
a setting's meaning is written once.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Any

import attrs

FLAG_SPEC = "lrft.flag"
"""The ``attrs`` metadata key of a field's :class:`FlagSpec`."""


class FlagGroup(enum.Enum):
    """The sections of ``lrft train --help``, in the order shown; the value is the title."""

    MODEL_AND_DATA = "model and data"
    MEDIA = "images (vision-language models)"
    REWARDS = "rewards"
    ROLLOUT = "rollout and sampling"
    ENGINE = "rollout engine"
    ALGORITHM = "algorithm (advantages, KL, policy loss)"
    CRITIC = "critic (PPO, with --advantage_estimator gae)"
    DISTILLATION = "on-policy distillation (a teacher) and process rewards"
    TRAINING = "training"
    LORA = "LoRA (adapters on the actor; pip install 'lrft[lora]')"
    BACKEND = "train backend (FSDP2, DeepSpeed) and collectives"
    OUTPUT = "outputs, checkpoints, evaluation and logging"


Choices = Sequence[str] | Callable[[], Sequence[str]]
"""The values a flag accepts; a function is called when the parser is built, after ``--plugins``
were imported, so that what they register can be chosen."""


@attrs.frozen(kw_only=True)
class FlagSpec:
    """How one field is read from the command line (the flag's name is the field's)."""

    group: enum.Enum
    """Where ``--help`` lists the flag; required, so that no flag is left out of the listing."""
    metavar: str | tuple[str, ...] | None = None
    choices: Choices | None = None
    nargs: str | None = None
    """``"+"`` for a flag of one or more values; a field of a fixed-length tuple type takes
    that many values without it."""
    kind: Callable[[str], Any] | None = None
    """The parser of one value; unset: the field's type (a list of several values is one
    comma-separated string that the field's converter splits)."""
    computed_default: str | None = None
    """How ``--help`` states a default computed from other settings."""


def flag(group: enum.Enum, **options: Any) -> dict[str, FlagSpec]:
    """A field's metadata: its :class:`FlagSpec` (``options`` are its other attributes)."""
    return {FLAG_SPEC: FlagSpec(group=group, **options)}


# The metadata of a field whose flag needs nothing but its group.
MODEL_AND_DATA = flag(FlagGroup.MODEL_AND_DATA)
MEDIA = flag(FlagGroup.MEDIA)
REWARDS = flag(FlagGroup.REWARDS)
ROLLOUT = flag(FlagGroup.ROLLOUT)
ENGINE = flag(FlagGroup.ENGINE)
ALGORITHM = flag(FlagGroup.ALGORITHM)
CRITIC = flag(FlagGroup.CRITIC)
DISTILLATION = flag(FlagGroup.DISTILLATION)
TRAINING = flag(FlagGroup.TRAINING)
LORA = flag(FlagGroup.LORA)
BACKEND = flag(FlagGroup.BACKEND)
OUTPUT = flag(FlagGroup.OUTPUT)


def optional_int(text: str) -> int | None:
    """An integer, or ``none`` for unset."""
    return None if text.lower() == "none" else int(text)
