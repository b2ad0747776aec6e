"""Weights & Biases logging: the trainer's metrics and config as one W&B run, from rank 0.

``wandb`` is optional (``pip install 'lrft[wandb]'``) and imported only when a run starts. The API
key never passes through lrft: wandb reads ``WANDB_API_KEY`` from the environment (or the
credentials ``wandb login`` stored), so it does not show up in process lists or saved configs.
``WANDB_MODE=offline`` writes the run to local files only (``wandb sync`` uploads them later).
"""

from __future__ import annotations

import os
import secrets
import string
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from lrft.api.errors import ConfigError
from lrft.extras import WANDB_EXTRA, wandb_available
from lrft.redaction import redact

if TYPE_CHECKING:
    from wandb.sdk.wandb_run import Run

"""How to install the optional W&B dependency; named in errors."""

DEFAULT_PROJECT = "lrft"
FILES_DIR = "wandb"
"""The folder wandb makes for its local files under the settings' ``directory``."""

_RUN_ID_CHARACTERS = string.ascii_lowercase + string.digits


def new_run_id() -> str:
    """A fresh W&B run id (8 characters of ``[a-z0-9]``, as wandb makes its own)."""
    return "".join(secrets.choice(_RUN_ID_CHARACTERS) for _ in range(8))


@attrs.frozen(kw_only=True)
class WandbSettings:
    """Where a run goes: ``project`` (and ``entity``, the user or organisation; ``None``: the
    account's default), an optional ``group`` and display ``name``. ``directory`` receives
    wandb's local files (``directory/wandb/``) unless ``WANDB_DIR`` is set."""

    directory: Path
    project: str = DEFAULT_PROJECT
    entity: str | None = None
    group: str | None = None
    name: str | None = None


@contextmanager
def _redacted_argv() -> Iterator[None]:
    """``sys.argv`` with URL credentials hidden for the block: wandb (0.31) records the command
    line (``sys.argv[1:]``) in the run's metadata when the run starts."""
    original = sys.argv
    sys.argv = redact(list(original))
    try:
        yield
    finally:
        sys.argv = original


class WandbMetrics:
    """One W&B run: ``config`` as the run's config (URL credentials hidden by
    :func:`lrft.redaction.redact`), each metric logged at its step.

    The run id is chosen at construction; :meth:`continue_run` replaces it with the id a
    checkpoint recorded, so a resumed job appends to the same run instead of starting a new
    curve. :meth:`start` opens the run (``resume="allow"``: the id's run continues when it
    exists); :meth:`log` starts it if needed. :meth:`close` finishes it, marked failed when
    ``failed`` (exit code 1), so W&B shows a crashed job as such rather than as running.
    """

    def __init__(self, settings: WandbSettings, *, config: Mapping[str, Any]) -> None:
        if not wandb_available():
            raise ImportError(f"W&B logging needs the wandb package: {WANDB_EXTRA}")
        self.settings = settings
        self.config = redact(dict(config))
        self.run_id = new_run_id()
        self._run: Run | None = None

    @property
    def started(self) -> bool:
        return self._run is not None

    def continue_run(self, run_id: str) -> None:
        """Log into the existing run ``run_id`` (from a checkpoint); only before :meth:`start`."""
        if self._run is not None:
            raise RuntimeError(
                f"W&B run {self.run_id} has already started: cannot switch it to {run_id}"
            )
        self.run_id = run_id

    def start(self) -> None:
        if self._run is not None:
            return
        import wandb

        directory = None
        if not os.environ.get("WANDB_DIR"):
            self.settings.directory.mkdir(parents=True, exist_ok=True)
            directory = str(self.settings.directory)
        try:
            with _redacted_argv():
                self._run = wandb.init(
                    project=self.settings.project,
                    entity=self.settings.entity,
                    group=self.settings.group,
                    name=self.settings.name,
                    id=self.run_id,
                    resume="allow",
                    config=self.config,
                    dir=directory,
                )
        except wandb.errors.Error as error:
            # Typically no credentials: say how to give them, not only what wandb missed.
            raise ConfigError(
                f"W&B could not start run {self.run_id}: {error} (set WANDB_API_KEY or run "
                "`wandb login` beforehand; WANDB_MODE=offline logs to local files only)"
            ) from error

    def log(self, step: int, kind: str, values: Mapping[str, float]) -> None:
        del kind  # the metric names already carry it (train/..., eval/...)
        self.start()
        assert self._run is not None
        self._run.log(dict(values), step=step)

    def close(self, *, failed: bool = False) -> None:
        if self._run is not None:
            self._run.finish(exit_code=1 if failed else 0)
            self._run = None
