"""The error raised when prompt data does not fit its configuration."""

from __future__ import annotations

from lrft.api.errors import ConfigError


class PromptDataError(ConfigError):
    """A row of the prompt data does not fit the configuration (a missing key, a value of the
    wrong kind, a broken line); the message names the key, the source and the row."""
