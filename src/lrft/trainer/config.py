"""Moved to :mod:`lrft.config`; this name re-exports it for one release."""

from lrft.config import *  # noqa: F403
from lrft.config import __all__ as __all__
