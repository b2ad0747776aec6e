"""Engine-independent bookkeeping of a ``RolloutEngine``: memory states and weight versions.

Every adapter (hf, vLLM, SGLang) keeps one ``EngineLifecycle`` and asks it before acting: it
validates the call against the contract of ``lrft.api.RolloutEngine``, says what the adapter has
to do (``SleepPlan``, ``WakePlan``), and records the result only after the adapter did it, so an
adapter that fails half-way leaves the recorded state as it was. Weight updates go through
``weight_update``, which validates each batch whole, tracks what was copied and decides whether
the engine ends fresh or stale. The adapter only supplies the code that moves memory and copies
tensors; the rules live here, once, and ``_engine_base.EngineAdapter`` asks them around the
adapter's own moves.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Protocol

import attrs
import torch

from lrft.api.capabilities import EngineCapabilities
from lrft.api.errors import (
    CapabilityNotSupported,
    EngineAsleepError,
    LrftError,
    StaleWeightsError,
    WeightLoadError,
)
from lrft.api.protocols import NamedTensors, WeightLoader
from lrft.api.types import (
    EnginePart,
    EngineState,
    GenerationRequest,
    TensorSpec,
    WeightsResidency,
)

#: Copies one validated batch, ``(canonical name, tensor)`` pairs, into the engine's weights.
CopyBatch = Callable[[list[tuple[str, torch.Tensor]]], None]


@attrs.frozen(kw_only=True)
class SleepPlan:
    """What ``sleep(level)`` must do, given the state the engine is in now."""

    level: int
    free_kv_cache: bool
    weights_from: WeightsResidency
    weights_to: WeightsResidency

    @property
    def moves_weights(self) -> bool:
        return self.weights_from is not self.weights_to


@attrs.frozen(kw_only=True)
class WakePlan:
    """What ``wake(parts)`` must do: first the weights (``weights_from`` is where they are now,
    ``None`` when they stay as they are), then the KV cache."""

    weights_from: WeightsResidency | None
    restore_kv_cache: bool


def resolve_name(name: str, specs: Mapping[str, TensorSpec], aliases: Mapping[str, str]) -> str:
    """The name ``specs`` lists the weight ``name`` under; ``WeightLoadError`` if none."""
    canonical = aliases.get(name, name)
    if canonical not in specs:
        raise WeightLoadError(
            f"unknown weight {name!r}: the engine has no parameter of that name "
            f"({len(specs)} known, e.g. {sorted(specs)[:3]}); nothing was loaded"
        )
    return canonical


def validate_batch(
    named_tensors: NamedTensors,
    specs: Mapping[str, TensorSpec],
    aliases: Mapping[str, str],
) -> list[tuple[str, torch.Tensor]]:
    """Check a whole batch before any of it is copied; return it under canonical names.

    ``aliases`` maps other names of a weight (a tied ``lm_head.weight``) to the name it is listed
    under in ``specs``. Raises ``WeightLoadError`` naming the first tensor that does not fit.
    """
    resolved = []
    for name, tensor in named_tensors:
        canonical = resolve_name(name, specs, aliases)
        spec = specs[canonical]
        if tensor.shape != spec.shape:  # a torch.Size is a tuple
            raise WeightLoadError(
                f"weight {name!r} has shape {tuple(tensor.shape)}, the engine stores "
                f"{spec.shape}; nothing was loaded"
            )
        resolved.append((canonical, tensor))
    return resolved


class EngineLifecycle:
    """The recorded memory state and weight freshness of one engine, and the contract's rules.

    ``weights_version`` starts at ``initial_version``: the weights an engine is built from are a
    complete set. ``_needs_complete_update`` is set whenever the weights stop being a whole
    version (released at level 2, or an update failed after copying): only an update covering
    every parameter makes them fresh again, so a partial update never labels a mix of versions.
    """

    def __init__(
        self,
        *,
        backend: str,
        capabilities: EngineCapabilities,
        specs: Mapping[str, TensorSpec],
        aliases: Mapping[str, str] | None = None,
        initial_version: int | None = 0,
    ) -> None:
        self.backend = backend
        self.capabilities = capabilities
        self.specs = dict(specs)
        self.aliases = dict(aliases or {})
        self._weights = WeightsResidency.RESIDENT
        self._kv_cache_resident = True
        self._version = initial_version
        self._needs_complete_update = initial_version is None
        self._updating = False
        self._closed = False
        self._last_names: tuple[tuple[str, ...], list[str]] | None = None

    # --- state -----------------------------------------------------------------------------

    @property
    def state(self) -> EngineState:
        return EngineState(
            weights=self._weights,
            kv_cache_resident=self._kv_cache_resident,
            weights_version=self._version,
            sleep_level=self._sleep_level(),
        )

    @property
    def weights_version(self) -> int | None:
        return self._version

    def canonical_names(self, names: Sequence[str]) -> list[str]:
        """The names ``specs`` lists ``names`` under (``WeightLoadError`` for an unknown one).
        A sync lends every weight, every step, under the same tuple of names: the answer for
        the last tuple is kept, and names that are already canonical (all of them, unless some
        are aliases) pass with one C call each."""
        last = self._last_names
        if last is not None and last[0] is names:
            return last[1]
        specs, aliases = self.specs, self.aliases
        canonical = (
            list(names)
            if all(map(specs.__contains__, names)) and aliases.keys().isdisjoint(names)
            else [resolve_name(name, specs, aliases) for name in names]
        )
        if isinstance(names, tuple):  # immutable, so the same object means the same names
            self._last_names = (names, canonical)
        return canonical

    @property
    def closed(self) -> bool:
        return self._closed

    def _sleep_level(self) -> int:
        if self._weights is WeightsResidency.RELEASED:
            return 2
        if self._weights is WeightsResidency.PARKED or not self._kv_cache_resident:
            return 1
        return 0

    # --- checks ----------------------------------------------------------------------------

    def check_open(self) -> None:
        if self._closed:
            raise LrftError(f"the {self.backend} engine was shut down; build a new one")

    def check_can_generate(self, requests: Sequence[GenerationRequest]) -> None:
        """Refuse ``generate`` unless the engine is open, awake and fresh, and ``requests`` carry
        no modality it does not declare (before any work)."""
        self.check_open()
        asleep = []
        if self._weights is not WeightsResidency.RESIDENT:
            asleep.append(f"weights ({self._weights.value})")
        if not self._kv_cache_resident:
            asleep.append("kv_cache")
        if asleep:
            raise EngineAsleepError(
                f"the {self.backend} engine cannot generate while {' and '.join(asleep)} "
                "asleep: call wake() first"
            )
        if self._version is None:
            raise StaleWeightsError(
                f"the {self.backend} engine's weights are stale (released at sleep level 2, an "
                "update in progress, or a failed update): load a complete set of weights first"
            )
        declared = self.capabilities.names()
        for request in requests:
            if request.media is None:
                continue
            missing = sorted(request.media.modalities - declared)
            if missing:
                raise CapabilityNotSupported(
                    self.backend,
                    missing[0],
                    f"request {request.request_id!r} carries "
                    f"{request.media.count(missing[0])} item(s) of it",
                )

    def check_weights_resident(self, action: str) -> None:
        self.check_open()
        if self._weights is not WeightsResidency.RESIDENT:
            raise EngineAsleepError(
                f"cannot {action}: the {self.backend} engine's weights are "
                f"{self._weights.value}; call wake([EnginePart.WEIGHTS]) first"
            )

    def _check_not_updating(self, action: str) -> None:
        if self._updating:
            raise LrftError(f"cannot {action} while a weight update is open")

    # --- sleep and wake ----------------------------------------------------------------------

    def plan_sleep(self, level: int) -> SleepPlan:
        """Validate ``sleep(level)``; deepening is allowed, a shallower level keeps the deeper."""
        self.check_open()
        if level not in self.capabilities.sleep_levels:
            raise CapabilityNotSupported(
                self.backend,
                f"sleep_level_{level}",
                f"declared sleep levels are {sorted(self.capabilities.sleep_levels)}",
            )
        self._check_not_updating("sleep")
        target = WeightsResidency.RELEASED if level == 2 else WeightsResidency.PARKED
        weights_to = self._weights
        if self._weights is WeightsResidency.RESIDENT or target is WeightsResidency.RELEASED:
            weights_to = target
        return SleepPlan(
            level=level,
            free_kv_cache=self._kv_cache_resident,
            weights_from=self._weights,
            weights_to=weights_to,
        )

    def finish_sleep(self, plan: SleepPlan) -> None:
        """Record a sleep the adapter carried out."""
        self._kv_cache_resident = False
        self._weights = plan.weights_to
        if plan.weights_to is WeightsResidency.RELEASED:
            # Released weights are no version at all; waking gives undefined memory.
            self._version = None
            self._needs_complete_update = True

    def plan_wake(self, parts: Collection[EnginePart]) -> WakePlan:
        """Validate ``wake(parts)``: the KV cache may only wake when the weights are resident."""
        self.check_open()
        self._check_not_updating("wake")
        wanted = {EnginePart(part) for part in parts}
        weights_from = None
        if EnginePart.WEIGHTS in wanted and self._weights is not WeightsResidency.RESIDENT:
            weights_from = self._weights
        restore_kv = EnginePart.KV_CACHE in wanted and not self._kv_cache_resident
        if restore_kv and EnginePart.WEIGHTS not in wanted:
            self.check_weights_resident("wake the KV cache")
        return WakePlan(weights_from=weights_from, restore_kv_cache=restore_kv)

    def finish_wake(self, plan: WakePlan) -> None:
        """Record a wake the adapter carried out."""
        if plan.weights_from is not None:
            self._weights = WeightsResidency.RESIDENT
        if plan.restore_kv_cache:
            self._kv_cache_resident = True

    # --- weights -----------------------------------------------------------------------------

    @contextmanager
    def weight_update(
        self, version: int, copy: CopyBatch, store: WeightStore | None = None
    ) -> Iterator[WeightLoader]:
        """The contract's update rules around an adapter's ``copy``; see ``RolloutEngine``.

        With a ``store`` the loader is an ``InPlaceWeightLoader`` that lends its storage."""
        self.check_weights_resident("load weights")
        self._check_not_updating("open a weight update")
        self._version = None  # stale from entry until a clean exit
        self._updating = True
        loader = _Loader(self, copy) if store is None else _InPlaceLoader(self, copy, store)
        try:
            yield loader
        except BaseException:
            # Stale even if nothing was copied: the caller meant to replace these weights and
            # did not, so serving them as current would be serving stale weights.
            if loader.copied_any:
                self._needs_complete_update = True
            raise
        finally:
            self._updating = False
            loader.open = False
        if self._needs_complete_update and loader.covered != set(self.specs):
            return  # still stale: part of the weights holds no version
        self._version = version
        self._needs_complete_update = False

    def close(self) -> bool:
        """Mark the engine shut down; True the first time (the adapter then frees resources)."""
        first = not self._closed
        self._closed = True
        return first


class WeightStore(Protocol):
    """What an engine that loads in place gives its lifecycle: its storage, lent by canonical
    name, and the fingerprint sums of what it holds (see ``InPlaceWeightLoader``)."""

    def storage(self, names: list[str]) -> list[torch.Tensor]: ...

    def digest_order(self) -> Sequence[str]: ...

    def digest_sums(self) -> torch.Tensor: ...


class _Loader:
    """The ``WeightLoader`` of one update: validates each batch whole, records what it covers."""

    def __init__(self, lifecycle: EngineLifecycle, copy: CopyBatch) -> None:
        self._lifecycle = lifecycle
        self._copy = copy
        self.covered: set[str] = set()
        self.copied_any = False
        self.open = True

    def _check_open(self, action: str) -> None:
        self._lifecycle.check_open()
        if not self.open:
            raise RuntimeError(f"cannot {action}: its weight_update block has exited")

    def __call__(self, named_tensors: NamedTensors) -> None:
        self._check_open("load through this loader")
        lifecycle = self._lifecycle
        batch = validate_batch(named_tensors, lifecycle.specs, lifecycle.aliases)
        # Set before copying: a copy that fails half-way has already changed some weights.
        self.copied_any = self.copied_any or bool(batch)
        self._copy(batch)
        self.covered.update(name for name, _ in batch)


class _InPlaceLoader(_Loader):
    """A ``_Loader`` that also lends the engine's storage (``InPlaceWeightLoader``)."""

    def __init__(self, lifecycle: EngineLifecycle, copy: CopyBatch, store: WeightStore) -> None:
        super().__init__(lifecycle, copy)
        self._store = store

    def targets(self, names: Sequence[str]) -> list[torch.Tensor]:
        self._check_open("lend weights")
        canonical = self._lifecycle.canonical_names(names)
        # Lent storage may be written at once: from here on the weights are not a version.
        self.copied_any = self.copied_any or bool(canonical)
        self.covered.update(canonical)
        return self._store.storage(canonical)

    def digest_order(self) -> Sequence[str]:
        self._check_open("read the digest order")
        return self._store.digest_order()

    def digest_sums(self) -> torch.Tensor:
        self._check_open("read the digest sums")
        return self._store.digest_sums()
