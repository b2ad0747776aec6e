"""Moved to :mod:`lrft.run.checkpoint`; this name re-exports it for one release."""

from lrft.run.checkpoint import *  # noqa: F403
