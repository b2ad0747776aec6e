"""LoRA adapters on a trainable model, with peft (``pip install 'lrft[lora]'``).

Adapters are a property of the model, not of a backend: :func:`apply_lora` wraps a causal LM
with peft's LoRA layers on the named linear modules and freezes everything else, and any train
backend then wraps the result like any model. The frozen base is sharded like any frozen
model, the optimizer holds the adapters' state only, ``full_weights`` yields the merged weights
under the base model's names (so every engine and sync works unchanged) and checkpoints hold the
adapters. :class:`AdaptersDisabled` is the reference policy: the actor itself with its adapters
switched off, no second copy of the base.

peft is imported on first use; a missing peft raises ``ImportError`` naming the extra.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Iterator, Sequence
from typing import Any, Protocol

import attrs
import torch

from lrft.api import validators as v
from lrft.api.errors import CapabilityNotSupported, ConfigError
from lrft.api.protocols import TrainableModel
from lrft.api.types import ModelPart, Placement
from lrft.backends.train._weights_layout import is_peft_model
from lrft.extras import LORA_EXTRA

ALL_LINEAR = "all-linear"
"""``target_modules`` shorthand: every ``torch.nn.Linear`` but the output head (peft's)."""


def require_peft() -> None:
    """Import peft, or raise ``ImportError`` naming the extra that installs it."""
    try:
        import peft  # noqa: F401
    except ImportError as error:
        raise ImportError(f"LoRA needs peft: {LORA_EXTRA}") from error


def _names(_: object, attribute: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    if not value or any(not name for name in value):
        raise ConfigError(f"{attribute.name} must name at least one module, got {value!r}")


@attrs.frozen(kw_only=True)
class LoraSettings:
    """The adapters: rank ``r``, scaling ``alpha / r``, dropout on their input, and the modules
    they adapt (module names or name suffixes, as peft matches them, or ``all-linear``)."""

    rank: int = attrs.field(validator=v.positive_number)
    alpha: int = attrs.field(default=16, validator=v.positive_number)
    dropout: float = attrs.field(default=0.0, validator=v.unit_interval_closed_open)
    target_modules: tuple[str, ...] = attrs.field(default=(ALL_LINEAR,), validator=_names)

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


def _matches(path: str, target: str) -> bool:
    return path == target or path.endswith(f".{target}")


def adapted_modules(model: torch.nn.Module, settings: LoraSettings) -> list[str]:
    """The paths of the modules ``settings.target_modules`` names in ``model``, checked: every
    name matches at least one module, and every match is a ``torch.nn.Linear`` (the modules
    lrft merges adapters of). Raises ``ConfigError`` naming the value and the rule."""
    head = _output_head(model)
    linear = {
        path
        for path, module in model.named_modules()
        if type(module) is torch.nn.Linear and module is not head
    }
    found: set[str] = set()
    for target in settings.target_modules:
        if target == ALL_LINEAR:
            if not linear:
                raise ConfigError(
                    f"target_modules {ALL_LINEAR!r}: {type(model).__name__} has no "
                    "torch.nn.Linear module besides its output head to adapt"
                )
            found |= linear
            continue
        matched = [path for path, _ in model.named_modules() if path and _matches(path, target)]
        if not matched:
            raise ConfigError(
                f"target_modules name {target!r} matches no module of {type(model).__name__} "
                f"(a name matches a module whose path is it or ends in '.{target}'); "
                f"its linear modules end in {sorted({p.rsplit('.', 1)[-1] for p in linear})}"
            )
        other = [path for path in matched if path not in linear]
        if other:
            kind = type(model.get_submodule(other[0])).__name__
            raise ConfigError(
                f"target_modules name {target!r} matches {other[0]} ({kind}): lrft merges "
                "LoRA adapters of torch.nn.Linear modules only (not the output head)"
            )
        found.update(matched)
    return sorted(found)


def _output_head(model: torch.nn.Module) -> torch.nn.Module | None:
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return head if isinstance(head, torch.nn.Module) else None


def apply_lora(model: torch.nn.Module, settings: LoraSettings) -> torch.nn.Module:
    """``model`` wrapped by peft with LoRA adapters on the modules ``settings`` names: only
    the adapters require grad. Raises ``ConfigError`` for names that match nothing or a module
    lrft cannot merge (checked first), or a model peft cannot wrap."""
    require_peft()
    from peft import LoraConfig, get_peft_model

    targets = adapted_modules(model, settings)
    config = LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=targets,
        bias="none",
    )
    try:
        with warnings.catch_warnings():
            # peft 0.21 reads transformers' deprecated is_gradient_checkpointing alias (5.2x
            # warns on every rank); it returns is_activation_checkpointing, the same value.
            warnings.filterwarnings(
                "ignore",
                message=r"`is_gradient_checkpointing` is deprecated",
                category=FutureWarning,
            )
            wrapped: torch.nn.Module = get_peft_model(model, config)
    except (ValueError, TypeError, NotImplementedError) as error:
        raise ConfigError(
            f"peft cannot add LoRA adapters to {type(model).__name__}: {error}"
        ) from error
    return wrapped


def check_lora_model(config: Any, settings: LoraSettings) -> None:
    """The checks of :func:`apply_lora` on a model built from the transformers ``config`` on the
    meta device (no weights, no memory): run before any process group starts."""
    from lrft.models.media import generative_model_class

    with torch.device("meta"):
        model = generative_model_class(config).from_config(config)
    apply_lora(model, settings)


def peft_model_of(module: torch.nn.Module) -> torch.nn.Module:
    """The peft model inside a handle's ``module`` (a DeepSpeed engine's module, or itself)."""
    # The engine first: a DeepSpeed engine forwards attribute reads (peft_config) to its module.
    for candidate in (getattr(module, "module", None), module):
        if isinstance(candidate, torch.nn.Module) and is_peft_model(candidate):
            return candidate
    raise TypeError(f"{type(module).__name__} holds no peft model")


class _BaseWeights(Protocol):
    """What both train backends' handles give of a LoRA model: its weights without adapters."""

    def base_weights(
        self, bucket_bytes: int, *, gather_dtype: torch.dtype | None = None
    ) -> Iterator[list[tuple[str, torch.Tensor]]]: ...


class _TrainableParameters(Protocol):
    def trainable_parameters(self) -> dict[str, torch.Tensor]: ...


def trainable_parameters(model: TrainableModel) -> dict[str, torch.Tensor]:
    """Every parameter of ``model`` that requires grad (a LoRA model's adapters), at full shape
    on the host, in the wrapped module's own names. Collective (the handles of lrft's train
    backends give it; ``TypeError`` for another)."""
    if not callable(getattr(model, "trainable_parameters", None)):
        raise TypeError(f"{type(model).__name__} gives no trainable_parameters")
    handle: Any = model
    source: _TrainableParameters = handle
    return source.trainable_parameters()


class _AdaptersOff(torch.nn.Module):
    """The actor's module, called with its adapters disabled."""

    def __init__(self, module: torch.nn.Module, peft_model: torch.nn.Module) -> None:
        super().__init__()
        # Held, not registered: this view owns no parameters of its own.
        object.__setattr__(self, "_actor", module)
        object.__setattr__(self, "_peft", peft_model)

    @property
    def module(self) -> torch.nn.Module:
        actor: torch.nn.Module = object.__getattribute__(self, "_actor")
        return actor

    def get_output_embeddings(self) -> torch.nn.Module:
        peft_model: Any = object.__getattribute__(self, "_peft")
        head: torch.nn.Module = peft_model.get_output_embeddings()
        return head

    @property
    def config(self) -> object:
        return getattr(object.__getattribute__(self, "_peft"), "config", None)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        peft_model: Any = object.__getattribute__(self, "_peft")
        with peft_model.disable_adapter():
            return self.module(*args, **kwargs)


class AdaptersDisabled:
    """A ``FrozenModel`` view of a LoRA actor with its adapters disabled: the reference policy
    for the KL, computed by the actor's own (sharded) base. Its forward is the actor's, so it is
    collective wherever the actor's is.

    Its parameters are the actor's: ``offload``/``reload`` raise ``CapabilityNotSupported``
    (moving them would move the actor), and ``placement`` is the actor's. ``full_weights``
    yields the base model's weights, adapters left out."""

    _backend = "lora"

    def __init__(self, actor: TrainableModel) -> None:
        if not callable(getattr(actor, "base_weights", None)):
            raise TypeError(f"{type(actor).__name__} gives no base_weights: not a LoRA handle")
        self._actor = actor
        self._module = _AdaptersOff(actor.module, peft_model_of(actor.module))

    @property
    def module(self) -> torch.nn.Module:
        return self._module

    @property
    def placement(self) -> Placement:
        return self._actor.placement

    def full_weights(
        self, bucket_bytes: int, *, gather_dtype: torch.dtype | None = None
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        actor: Any = self._actor
        source: _BaseWeights = actor
        return source.base_weights(bucket_bytes, gather_dtype=gather_dtype)

    def offload(self, parts: Collection[ModelPart]) -> None:
        self._refuse(parts)

    def reload(self, parts: Collection[ModelPart]) -> None:
        self._refuse(parts)

    def _refuse(self, parts: Sequence[ModelPart] | Collection[ModelPart]) -> None:
        for part in parts:
            raise CapabilityNotSupported(
                self._backend,
                f"offload_{ModelPart(part).value}",
                "the reference is the actor with its adapters disabled: its parameters are the "
                "actor's",
            )
