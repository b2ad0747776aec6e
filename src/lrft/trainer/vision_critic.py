"""Moved to :mod:`lrft.models.vision_critic`; this name re-exports it for one release."""

from lrft.models.vision_critic import *  # noqa: F403
