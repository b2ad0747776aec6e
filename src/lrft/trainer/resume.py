"""Moved to :mod:`lrft.run.resume`; this name re-exports it for one release."""

from lrft.run.resume import *  # noqa: F403
