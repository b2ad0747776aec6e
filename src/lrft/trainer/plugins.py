"""Moved to :mod:`lrft.backends.registry`, which builds every backend, lrft's own and installed
packages' alike; these names re-export it for one release."""

from lrft.backends.registry import build_engine as plugin_engine
from lrft.backends.registry import build_sync as plugin_sync
from lrft.backends.registry import build_train_backend as plugin_train_backend
from lrft.backends.registry import import_plugins

__all__ = ["import_plugins", "plugin_engine", "plugin_sync", "plugin_train_backend"]
