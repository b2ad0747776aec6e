"""Backends by name: built-ins, third-party entry points, explicit registrations.

Implementations are registered by dotted path and imported on first use, so ``import lrft``
never imports deepspeed, vllm or sglang. When a backend's optional dependency is missing, loading
it raises an ``ImportError`` that names the extra to install. Third-party packages register
their backends under the entry-point groups ``lrft.train_backends``, ``lrft.rollout_engines`` and
``lrft.weight_syncs`` (``name = "package.module:Class"``), or call :func:`register`.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import Literal

import attrs

from lrft.api.errors import ConfigError

Kind = Literal["train", "rollout", "sync"]

ENTRY_POINT_GROUPS: dict[Kind, str] = {
    "train": "lrft.train_backends",
    "rollout": "lrft.rollout_engines",
    "sync": "lrft.weight_syncs",
}


@attrs.frozen(kw_only=True)
class BackendEntry:
    """Where a backend lives (``module:attribute``) and the extra that installs its dependencies."""

    kind: Kind
    name: str
    target: str
    extra: str | None = None

    def __attrs_post_init__(self) -> None:
        module, _, attribute = self.target.partition(":")
        if not module or not attribute:
            raise ConfigError(
                f"backend target {self.target!r} must look like 'package.module:Name'"
            )


_REGISTRY: dict[tuple[Kind, str], BackendEntry] = {}


def register(kind: Kind, name: str, target: str, *, extra: str | None = None) -> None:
    """Make ``target`` (``module:attribute``) loadable as the ``kind`` backend ``name``."""
    key = (kind, name)
    if key in _REGISTRY and _REGISTRY[key].target != target:
        raise ConfigError(
            f"{kind} backend {name!r} is already registered as {_REGISTRY[key].target!r}"
        )
    _REGISTRY[key] = BackendEntry(kind=kind, name=name, target=target, extra=extra)


def _entry_points(kind: Kind) -> dict[str, BackendEntry]:
    found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUPS[kind])
    return {ep.name: BackendEntry(kind=kind, name=ep.name, target=ep.value) for ep in found}


def entries(kind: Kind) -> dict[str, BackendEntry]:
    """Every ``kind`` backend known now: registered ones win over entry points of the same name."""
    known = _entry_points(kind)
    known.update({name: entry for (k, name), entry in _REGISTRY.items() if k == kind})
    return dict(sorted(known.items()))


def is_known(kind: Kind, name: str) -> bool:
    """Whether ``name`` is a ``kind`` backend: registered ones are answered without reading the
    installed packages' entry points."""
    return (kind, name) in _REGISTRY or name in _entry_points(kind)


def load(kind: Kind, name: str) -> object:
    """Import and return the ``kind`` backend ``name`` (usually a class)."""
    known = entries(kind)
    entry = known.get(name)
    if entry is None:
        raise ConfigError(f"unknown {kind} backend {name!r}; known: {', '.join(known) or 'none'}")
    module_name, _, attribute = entry.target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if entry.extra is None or missing == "lrft" or missing.startswith("lrft."):
            raise  # a bug in lrft itself, not a missing optional dependency
        raise ImportError(
            f"the {kind} backend {name!r} needs the package {exc.name!r}, which is not installed: "
            f"pip install 'lrft[{entry.extra}]'"
        ) from exc
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ConfigError(
            f"{kind} backend {name!r}: module {module_name!r} has no attribute {attribute!r}"
        ) from None


register("train", "fsdp2", "lrft.backends.train.fsdp2:FSDP2Backend")
register("train", "deepspeed", "lrft.backends.train.deepspeed:DeepSpeedBackend", extra="deepspeed")
register("rollout", "hf", "lrft.backends.rollout.hf:HFRolloutEngine")
register("rollout", "vllm", "lrft.backends.rollout.vllm:VLLMRolloutEngine", extra="vllm")
register("sync", "direct", "lrft.backends.sync.direct:DirectSync")
register("sync", "broadcast", "lrft.backends.sync.broadcast:BroadcastSync")
