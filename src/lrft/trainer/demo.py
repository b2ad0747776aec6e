"""Moved to :mod:`lrft.demos`; this name re-exports it for one release."""

from lrft.demos import *  # noqa: F403
