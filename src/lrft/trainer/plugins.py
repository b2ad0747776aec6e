"""Backends chosen by name, and the modules that register what users choose by name.

``lrft train`` resolves ``--engine_type``, ``--train_backend`` and ``--weight_sync`` through
:mod:`lrft.backends.registry` (lrft's own backends and installed packages' entry points alike).
lrft's own are built from their own settings in :mod:`lrft.trainer.build`; any other is built
here, by its class's ``from_spec`` (:mod:`lrft.api.plugins`), and what it returns is checked
against its Protocol. ``--plugins`` names modules imported first, on every rank, so that the
estimators, losses and backends they register are known when the settings are read.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import TypeVar

from lrft.api.errors import ConfigError
from lrft.api.plugins import EngineSpec, TrainBackendSpec, WeightSyncSpec
from lrft.api.protocols import RolloutEngine, TrainBackend, WeightSync
from lrft.backends import registry
from lrft.backends.registry import Kind

T = TypeVar("T")


def import_plugins(modules: Iterable[str]) -> None:
    """Import each module (its registrations run); raises ``ConfigError`` naming one that
    cannot be imported."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as error:
            raise ConfigError(f"plugins entry {name!r} cannot be imported: {error}") from error


def _from_spec(kind: Kind, name: str, spec: object, protocol: type[T]) -> T:
    target = registry.load(kind, name)
    build = getattr(target, "from_spec", None)
    if not callable(build):
        raise ConfigError(
            f"{kind} backend {name!r} ({registry.entries(kind)[name].target}) has no "
            "from_spec(spec): lrft train builds a backend chosen by name with it (see "
            "lrft.api.plugins)"
        )
    built = build(spec)
    if not isinstance(built, protocol):
        raise ConfigError(
            f"{kind} backend {name!r}: from_spec returned a {type(built).__name__}, which lacks "
            f"members of the {protocol.__name__} Protocol (lrft.api.protocols)"
        )
    return built


def plugin_engine(name: str, spec: EngineSpec) -> RolloutEngine:
    """The registered rollout engine ``name`` built from ``spec``; refused when its declared
    ``max_tp`` is below ``spec.tp_size``."""
    engine = _from_spec("rollout", name, spec, RolloutEngine)  # type: ignore[type-abstract]  # a Protocol, checked at run time
    if engine.capabilities.max_tp < spec.tp_size:
        engine.shutdown()
        raise ConfigError(
            f"engine_tp_size {spec.tp_size} exceeds engine {name!r}'s maximum tensor-parallel "
            f"size {engine.capabilities.max_tp} (its capabilities.max_tp)"
        )
    return engine


def plugin_train_backend(name: str, spec: TrainBackendSpec) -> TrainBackend:
    """The registered train backend ``name`` built from ``spec``."""
    return _from_spec("train", name, spec, TrainBackend)  # type: ignore[type-abstract]  # a Protocol, checked at run time


def plugin_sync(name: str, spec: WeightSyncSpec) -> WeightSync:
    """The registered weight sync ``name`` built from ``spec``."""
    return _from_spec("sync", name, spec, WeightSync)  # type: ignore[type-abstract]  # a Protocol, checked at run time
