"""Backends by name, and the one way lrft builds them.

Every backend, lrft's own and a package's alike, is an entry here: where its class lives
(``module:Class``, imported on first use, so ``import lrft`` never imports deepspeed, vllm or
sglang), the extra that installs its dependencies (a missing package raises an ``ImportError``
naming it), how it is built, and, for a rollout engine, the facts its settings are checked
against before anything is built (:class:`EngineFacts`). Third-party packages register their
backends under the entry-point groups ``lrft.train_backends``, ``lrft.rollout_engines`` and
``lrft.weight_syncs`` (``name = "package.module:Class"``), or call :func:`register` from a
module that ``--plugins`` names (:func:`import_plugins`).

Building: :func:`build_engine`, :func:`build_train_backend` and :func:`build_sync` take the
spec of their kind (:mod:`lrft.api.plugins`) and call the entry's ``builder`` when it names one
(``module:function``; lrft's own are in :mod:`lrft.backends.builders`), else the class's
``from_spec`` classmethod; what comes back is checked against the kind's Protocol, and an
engine against the spec's TP size (its ``capabilities.max_tp``).

Settings beyond the spec: a spec holds what every backend of its kind reads. What one backend
alone reads (the hf engine's decoding path, the memory share vLLM reserves up front, FSDP2's
resharding) travels in the spec's ``options`` mapping, which that backend's builder turns into
an attrs class of its own with :func:`lrft.api.plugins.read_options` (an unknown name is
refused naming the backend; a bad value by the backend's own validators). Which options a caller
sends follows from the entry: an engine whose facts list decoding paths gets ``decode``, one
that reserves memory gets ``memory_share``. This is chosen over builders that take
typed extras as a second argument because the caller then needs no per-backend code to reach a
builder: every backend is built by the same call from the same record, and a package's engine
can declare the same facts (``reserves_memory``) and receive the same options as lrft's own.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable, Iterable
from typing import Any, Literal, TypeVar

import attrs

from lrft import extras
from lrft.api import validators as v
from lrft.api.errors import ConfigError
from lrft.api.plugins import EngineSpec, TrainBackendSpec, WeightSyncSpec
from lrft.api.protocols import RolloutEngine, TrainBackend, WeightSync

Kind = Literal["train", "rollout", "sync"]

ENTRY_POINT_GROUPS: dict[Kind, str] = {
    "train": "lrft.train_backends",
    "rollout": "lrft.rollout_engines",
    "sync": "lrft.weight_syncs",
}

SETTINGS: dict[Kind, str] = {
    "train": "train_backend",
    "rollout": "engine_type",
    "sync": "weight_sync",
}
"""The setting that picks a backend of each kind, as errors name it."""

B = TypeVar("B")


def _dotted(_: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is None:
        return
    module, _sep, name = value.partition(":")
    if not module or not name:
        raise ConfigError(
            f"backend {attribute.name} {value!r} must look like 'package.module:Name'"
        )


@attrs.frozen(kw_only=True)
class EngineFacts:
    """What a rollout engine is whatever it is built with, known before it is built.

    max_tp: the largest tensor-parallel group it spans; ``None``: any group size that divides
        the world size. Once built, an engine's ``capabilities.max_tp`` says the same for the
        world it runs in.
    decode_paths: the decoding paths it offers, the values of its ``decode`` option (the first
        is the default); empty: it has one path and takes no ``decode`` option.
    reserves_memory: it reserves its memory up front, sized by its ``memory_share`` option (a
        fraction in (0, 1]); otherwise it allocates as it generates and takes no such option.
    """

    max_tp: int | None = attrs.field(default=None, validator=v.optional(v.positive_int))
    decode_paths: tuple[str, ...] = ()
    reserves_memory: bool = False


@attrs.frozen(kw_only=True)
class BackendEntry:
    """One backend: its class (``module:Class``), the extra that installs its dependencies and
    the top-level modules of those (``packages``: looked up, never imported, before anything
    starts), the ``module:function`` that builds it from its kind's spec (``None``: the class's
    ``from_spec``), and, for a rollout engine, its :class:`EngineFacts` (``None``: it declares
    them only once built, through its capabilities)."""

    kind: Kind
    name: str
    target: str = attrs.field(validator=_dotted)
    extra: str | None = None
    packages: tuple[str, ...] = ()
    builder: str | None = attrs.field(default=None, validator=_dotted)
    engine: EngineFacts | None = None

    def __attrs_post_init__(self) -> None:
        if self.engine is not None and self.kind != "rollout":
            raise ConfigError(f"{self.kind} backend {self.name!r}: only rollout engines have facts")


_REGISTRY: dict[tuple[Kind, str], BackendEntry] = {}


def register(
    kind: Kind,
    name: str,
    target: str,
    *,
    extra: str | None = None,
    packages: tuple[str, ...] = (),
    builder: str | None = None,
    engine: EngineFacts | None = None,
) -> None:
    """Make ``target`` (``module:attribute``) the ``kind`` backend ``name``; see
    :class:`BackendEntry` for the rest. Registering the same entry again is harmless."""
    entry = BackendEntry(
        kind=kind,
        name=name,
        target=target,
        extra=extra,
        packages=packages,
        builder=builder,
        engine=engine,
    )
    known = _REGISTRY.get((kind, name))
    if known is not None and known != entry:
        raise ConfigError(f"{kind} backend {name!r} is already registered as {known.target!r}")
    _REGISTRY[(kind, name)] = entry


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


def entry(kind: Kind, name: str) -> BackendEntry:
    """The ``kind`` backend ``name``; an unknown name raises ``ConfigError`` listing the known."""
    registered = _REGISTRY.get((kind, name))
    if registered is not None:
        return registered
    known = entries(kind)
    if name not in known:
        raise ConfigError(f"unknown {kind} backend {name!r}; known: {', '.join(known) or 'none'}")
    return known[name]


def engine_facts(name: str) -> EngineFacts | None:
    """The facts the registered rollout engine ``name`` declares; ``None`` for an engine that
    declares none (an entry point's) or an unknown name."""
    registered = _REGISTRY.get(("rollout", name))
    return None if registered is None else registered.engine


def missing_packages(kind: Kind, name: str) -> tuple[str, ...]:
    """One problem for each package the registered ``kind`` backend ``name`` declares and this
    environment lacks, with the line that installs its extra; ``()`` for a name registered by
    no one here (an entry point's, or unknown: its own checks name it)."""
    registered = _REGISTRY.get((kind, name))
    if registered is None:
        return ()
    install = f": pip install 'lrft[{registered.extra}]'" if registered.extra else ""
    return tuple(
        f"{SETTINGS[kind]} {name!r} needs the {package} package, which is not installed{install}"
        for package in registered.packages
        if not extras.installed(package)
    )


def declared_engine_facts() -> dict[str, EngineFacts]:
    """Each registered rollout engine that declares facts, by name."""
    return {
        name: known.engine
        for (kind, name), known in sorted(_REGISTRY.items())
        if kind == "rollout" and known.engine is not None
    }


def _resolve(known: BackendEntry, dotted: str) -> object:
    module_name, _, attribute = dotted.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if known.extra is None or missing == "lrft" or missing.startswith("lrft."):
            raise  # a bug in lrft itself, not a missing optional dependency
        raise ImportError(
            f"the {known.kind} backend {known.name!r} needs the package {exc.name!r}, which is "
            f"not installed: pip install 'lrft[{known.extra}]'"
        ) from exc
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ConfigError(
            f"{known.kind} backend {known.name!r}: module {module_name!r} has no attribute "
            f"{attribute!r}"
        ) from None


def load(kind: Kind, name: str) -> object:
    """Import and return the ``kind`` backend ``name`` (usually a class)."""
    known = entry(kind, name)
    return _resolve(known, known.target)


def _builder(known: BackendEntry) -> Callable[[object], object]:
    target = _resolve(known, known.target)  # first: a missing package's error names its extra
    build: object = (
        _resolve(known, known.builder)
        if known.builder is not None
        else getattr(target, "from_spec", None)
    )
    if not callable(build) and known.builder is not None:
        raise ConfigError(f"{known.kind} backend {known.name!r}: {known.builder} is not callable")
    if not callable(build):
        raise ConfigError(
            f"{known.kind} backend {known.name!r} ({known.target}) has no from_spec(spec): lrft "
            "train builds a backend chosen by name with it (see lrft.api.plugins)"
        )
    return build


def _build(kind: Kind, name: str, spec: object, protocol: type[B]) -> B:
    known = entry(kind, name)
    built = _builder(known)(spec)
    if not isinstance(built, protocol):
        how = "from_spec" if known.builder is None else f"its builder {known.builder}"
        raise ConfigError(
            f"{kind} backend {name!r}: {how} returned a {type(built).__name__}, which lacks "
            f"members of the {protocol.__name__} Protocol (lrft.api.protocols)"
        )
    return built


def build_engine(name: str, spec: EngineSpec) -> RolloutEngine:
    """The rollout engine ``name`` built from ``spec`` (collective for a TP engine); refused
    when its ``capabilities.max_tp`` is below ``spec.tp_size``."""
    engine = _build("rollout", name, spec, RolloutEngine)  # type: ignore[type-abstract]  # a Protocol, checked at run time
    if engine.capabilities.max_tp < spec.tp_size:
        engine.shutdown()
        raise ConfigError(
            f"engine_tp_size {spec.tp_size} exceeds engine {name!r}'s maximum tensor-parallel "
            f"size {engine.capabilities.max_tp} (its capabilities.max_tp)"
        )
    return engine


def build_train_backend(name: str, spec: TrainBackendSpec) -> TrainBackend:
    """The train backend ``name`` built from ``spec``."""
    return _build("train", name, spec, TrainBackend)  # type: ignore[type-abstract]  # a Protocol, checked at run time


def build_sync(name: str, spec: WeightSyncSpec) -> WeightSync:
    """The weight sync ``name`` built from ``spec``."""
    return _build("sync", name, spec, WeightSync)  # type: ignore[type-abstract]  # a Protocol, checked at run time


def import_plugins(modules: Iterable[str]) -> None:
    """Import each module (its registrations run); raises ``ConfigError`` naming one that
    cannot be imported."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as error:
            raise ConfigError(f"plugins entry {name!r} cannot be imported: {error}") from error


_BUILDERS = "lrft.backends.builders"

register("train", "fsdp2", "lrft.backends.train.fsdp2:FSDP2Backend", builder=f"{_BUILDERS}:fsdp2")
register(
    "train",
    "deepspeed",
    "lrft.backends.train.deepspeed:DeepSpeedBackend",
    extra="deepspeed",
    packages=("deepspeed",),
    builder=f"{_BUILDERS}:deepspeed",
)
register(
    "rollout",
    "hf",
    "lrft.backends.rollout.hf:HFRolloutEngine",
    builder=f"{_BUILDERS}:hf_engine",
    engine=EngineFacts(
        max_tp=1, decode_paths=("auto", "generate", "static", "cuda_graph", "compiled")
    ),
)
register(
    "rollout",
    "vllm",
    "lrft.backends.rollout.vllm:VLLMRolloutEngine",
    extra="vllm",
    packages=("vllm",),
    builder=f"{_BUILDERS}:vllm_engine",
    engine=EngineFacts(max_tp=None, reserves_memory=True),
)
register("sync", "direct", "lrft.backends.sync.direct:DirectSync", builder=f"{_BUILDERS}:direct")
register(
    "sync",
    "broadcast",
    "lrft.backends.sync.broadcast:BroadcastSync",
    builder=f"{_BUILDERS}:broadcast",
)
