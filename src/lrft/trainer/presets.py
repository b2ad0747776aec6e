"""Moved to :mod:`lrft.presets`; this name re-exports it for one release."""

from lrft.presets import *  # noqa: F403
