"""Each field's own rule: the validators and converters of :mod:`lrft.config.fields`.

Each raises ``ConfigError`` naming the field, the value and the rule. The rules that records
outside the config share (numbers, integers, intervals) are those of :mod:`lrft.api.validators`;
this module adds the rules of one setting (an estimator's name, a URL list, a JSON object) and
the converters of the command line's comma-separated forms.
"""

from __future__ import annotations

import json
import math
import re
import urllib.parse
from typing import Any

import attrs

from lrft.agents.registry import environments as environment_registry
from lrft.agents.registry import tools as tool_registry
from lrft.algo import AGGREGATION_MODES, advantage_estimators, kl_estimators, policy_losses
from lrft.api import validators as v
from lrft.api.errors import ConfigError
from lrft.backends import registry
from lrft.backends.registry import Kind
from lrft.config.choices import DEMO_NAMES, HF_DECODE_PATHS, PRESET_NAMES
from lrft.extras import PLOTS_EXTRA, tensorboard_available
from lrft.redaction import redact

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""What an environment variable's name may be (``remote_rm_auth_env`` holds names, not tokens)."""


def every_n_or_never(_: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if not v.is_int(value) or not (value == -1 or value > 0):
        raise ConfigError(
            f"{attribute.name} must be a positive number of iterations or -1, got {value!r}"
        )


optional_positive = v.optional(v.positive_int)
optional_non_negative = v.optional(v.non_negative)
optional_positive_float = v.optional(v.positive_number)
optional_unit_interval = v.optional(v.unit_interval)
optional_fraction = v.optional(v.unit_interval_open_closed)
optional_finite = v.optional(v.finite)


def token_ratio(_: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if not v.is_number(value) or not 0.0 <= value < 1.0:
        raise ConfigError(
            f"{attribute.name} must be in [0, 1) (the top fraction of tokens kept; 0 keeps "
            f"all), got {value!r}"
        )


def zero_stage(_: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None and value not in (1, 2, 3):
        raise ConfigError(f"{attribute.name} must be 1, 2 or 3 (or unset for FSDP2), got {value!r}")


# Choices among registries are looked up at validation time: users may register estimators and
# losses after this module is imported.


def estimator(_: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if value not in advantage_estimators:
        raise ConfigError(
            f"{attribute.name} {value!r} is unknown; choose one of "
            f"{', '.join(advantage_estimators.names())}"
        )


def policy_loss(_: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if value not in policy_losses:
        raise ConfigError(
            f"{attribute.name} {value!r} is unknown; choose one of {', '.join(policy_losses.names())}"
        )


def kl_estimator(_: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if value not in kl_estimators:
        raise ConfigError(
            f"{attribute.name} {value!r} is unknown; choose one of {', '.join(kl_estimators.names())}"
        )


def aggregation(_: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None and value not in AGGREGATION_MODES:
        raise ConfigError(
            f"{attribute.name} {value!r} is unknown; choose one of {', '.join(AGGREGATION_MODES)}"
        )


def engine(instance: object, attribute: attrs.Attribute[Any], value: str) -> None:
    # Any registered rollout engine: lrft's own, and those installed packages declare.
    backend_name("rollout")(instance, attribute, value)


def hf_decode(_: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if value not in HF_DECODE_PATHS:
        raise ConfigError(
            f"{attribute.name} {value!r} is unknown; choose one of {list(HF_DECODE_PATHS)}"
        )


def preset(_: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None and value not in PRESET_NAMES:
        raise ConfigError(
            f"{attribute.name} {value!r} is unknown; choose one of {list(PRESET_NAMES)}"
        )


def demo(_: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if value not in DEMO_NAMES:
        raise ConfigError(
            f"{attribute.name} {value!r} is unknown; choose one of {list(DEMO_NAMES)}"
        )


def tensorboard_installed(_: object, attribute: attrs.Attribute[Any], value: bool) -> None:
    """A switch that writes TensorBoard logs may be on only where tensorboard is installed."""
    if value and not tensorboard_available():
        raise ConfigError(
            f"{attribute.name} needs the tensorboard package, which is not installed: {PLOTS_EXTRA}"
        )


def wandb_switch(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    # LightRFT passes the API key in this flag; a config file copied from it would make a
    # truthy string here. Refuse it without echoing it: it is a secret.
    if not isinstance(value, bool):
        raise ConfigError(
            f"{attribute.name} must be true or false, got a {type(value).__name__}; lrft reads "
            "the W&B API key from the WANDB_API_KEY environment variable (or `wandb login`), "
            "never from its configuration"
        )


def redacted_repr(value: object) -> str:
    """The field's ``repr`` with URL credentials hidden (attrs' ``repr=`` hook)."""
    return repr(redact(value))


def remote_protocol(_: object, attribute: attrs.Attribute[Any], value: str) -> None:
    from lrft.rewards.remote_protocols import PROTOCOLS

    if value not in PROTOCOLS:
        raise ConfigError(f"{attribute.name} {value!r} is unknown; choose one of {list(PROTOCOLS)}")


def http_url(_: object, attribute: attrs.Attribute[Any], value: str) -> None:
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{attribute.name} {redact(value)!r} must be an http:// or https:// URL")


optional_http_url = v.optional(http_url)


def http_urls(_: object, attribute: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    for url in value:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(
                f"{attribute.name} entry {redact(url)!r} must be an http:// or https:// URL"
            )


def teacher_protocol(_: object, attribute: attrs.Attribute[Any], value: str) -> None:
    from lrft.distill.protocols import TEACHER_PROTOCOLS

    if value not in TEACHER_PROTOCOLS:
        raise ConfigError(
            f"{attribute.name} {value!r} is unknown; choose one of {list(TEACHER_PROTOCOLS)}"
        )


def non_empty_text(_: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if value == "":
        raise ConfigError(f"{attribute.name} must be a non-empty text, got ''")


optional_text = v.optional(non_empty_text)


# converters ---------------------------------------------------------------------------------


def clip_pair(value: object) -> tuple[float, float] | None:
    """``eps_clip_low_high`` as a pair of floats (its bounds are checked with the other clips)."""
    if value is None:
        return None
    numbers = isinstance(value, list | tuple) and len(value) == 2 and all(map(v.is_number, value))
    if not numbers:
        raise ConfigError(f"eps_clip_low_high must be two numbers LOW HIGH, got {value!r}")
    assert isinstance(value, list | tuple)
    return (float(value[0]), float(value[1]))


def _items(value: str | list[str] | tuple[str, ...] | None, name: str) -> tuple[str, ...]:
    """A comma-separated string (LightRFT's form) or a list, as a tuple of stripped items."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    stripped = tuple(str(item).strip() for item in items)
    if any(not item for item in stripped):
        raise ConfigError(
            f"{name} {redact(value)!r} has an empty entry; separate entries with single commas"
        )
    return stripped


def reward_paths(value: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    return _items(value, "reward_pretrain")


def reward_urls(value: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    return _items(value, "remote_rm_url")


def grm_paths(value: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    return _items(value, "grm_pretrain")


def auth_env_names(value: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """``remote_rm_auth_env``: variable names, one per URL; an empty entry sends no header."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    names = tuple(str(item).strip() for item in items)
    for name in names:
        if name and ENV_NAME.fullmatch(name) is None:
            raise ConfigError(
                f"remote_rm_auth_env entry {name!r} is not an environment variable name "
                "(letters, digits and _, not starting with a digit): give the variable's name, "
                "never the token itself"
            )
    if names and not any(names):
        raise ConfigError(f"remote_rm_auth_env {value!r} names no variable")
    return names


def weights(value: str | list[float] | tuple[float, ...] | None) -> tuple[float, ...] | None:
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    try:
        weights = tuple(float(item) for item in items)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"reward_weights {value!r} must be numbers: {error}") from error
    if not weights or not all(math.isfinite(w) for w in weights):
        raise ConfigError(f"reward_weights {value!r} must be one or more finite numbers")
    return weights


# --- LoRA --------------------------------------------------------------------------------------


def module_names(value: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """``target_modules``: names given as a list, space-separated values or commas."""
    items = [value] if isinstance(value, str) else list(value)
    names = tuple(part.strip() for item in items for part in str(item).split(",") if part.strip())
    if not names:
        raise ConfigError(f"target_modules must name at least one module, got {value!r}")
    return names


# the learning-rate schedule, KL control, data mixing, backends by name, plug-ins --------------

LR_SCHEDULERS = ("constant", "linear", "cosine", "cosine_with_min_lr")
"""``lr_scheduler``'s choices; ``cosine_with_min_lr`` is LightRFT's (cosine to a floor of 0.1)."""
ATTENTION_KERNELS = ("sdpa", "eager", "flash_attention_2")
"""``attn_implementation``'s choices: transformers' names for the training models' attention."""


def lr_scheduler(_: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if value not in LR_SCHEDULERS:
        raise ConfigError(
            f"{attribute.name} {value!r} is unknown; choose one of {', '.join(LR_SCHEDULERS)}"
        )


def warmup_ratio(_: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if not v.is_number(value) or not 0.0 <= value < 1.0:
        raise ConfigError(
            f"{attribute.name} must be in [0, 1) (the share of the run's optimizer steps spent "
            f"warming up), got {value!r}"
        )


def attention(_: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if value not in ATTENTION_KERNELS:
        raise ConfigError(
            f"{attribute.name} {value!r} is unknown; choose one of {', '.join(ATTENTION_KERNELS)}"
        )


def beta_pair(value: object) -> tuple[float, float]:
    """``adam_betas`` as two floats, each in [0, 1)."""
    numbers = isinstance(value, list | tuple) and len(value) == 2 and all(map(v.is_number, value))
    if not numbers:
        raise ConfigError(f"adam_betas must be two numbers BETA1 BETA2, got {value!r}")
    assert isinstance(value, list | tuple)
    betas = (float(value[0]), float(value[1]))
    if not all(0.0 <= beta < 1.0 for beta in betas):
        raise ConfigError(f"adam_betas must each be in [0, 1), got {betas}")
    return betas


def probabilities(value: str | list[float] | tuple[float, ...] | None) -> tuple[float, ...] | None:
    """``prompt_data_probs``: LightRFT's comma-separated string or a list; each > 0, sum 1."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    try:
        probs = tuple(float(item) for item in items)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"prompt_data_probs {value!r} must be numbers: {error}") from error
    if not probs or not all(math.isfinite(p) and p > 0 for p in probs):
        raise ConfigError(f"prompt_data_probs {value!r} must be numbers > 0")
    if abs(sum(probs) - 1.0) > 1e-6:
        raise ConfigError(f"prompt_data_probs {value!r} must sum to 1, got {sum(probs):g}")
    return probs


def plugin_modules(value: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """``plugins``: Python module names, comma-separated or a list."""
    names = _items(value, "plugins")
    for name in names:
        if not all(part.isidentifier() for part in name.split(".")):
            raise ConfigError(f"plugins entry {name!r} is not a Python module name (a.b.c)")
    return names


def backend_name(kind: Kind) -> Any:
    """A validator: the value names a ``kind`` backend known to :mod:`lrft.backends.registry`
    (built-in, registered, or an installed package's entry point)."""

    def check(_: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
        if value is None or registry.is_known(kind, value):
            return
        raise ConfigError(
            f"{attribute.name} {value!r} is unknown; known: {', '.join(registry.entries(kind))} "
            f"(a package adds one under the entry-point group {registry.ENTRY_POINT_GROUPS[kind]!r})"
        )

    return check


def environment(_: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    """A registered environment (:mod:`lrft.agents.registry`, entry points included), or a
    factory's ``module:attribute`` path (imported when the trainer is built)."""
    if value is None or value in environment_registry.names():
        return
    module, _, name = value.partition(":")
    if not (module and name):
        raise ConfigError(
            f"{attribute.name} {value!r} is unknown; choose one of "
            f"{list(environment_registry.names())}, or give a factory as module:attribute "
            "(or register one under the lrft.environments entry points)"
        )


def tool_names(value: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """``tools``: registered tool names, given as a list, space-separated values or commas."""
    items = [value] if isinstance(value, str) else list(value)
    names = tuple(part.strip() for item in items for part in str(item).split(",") if part.strip())
    known = tool_registry.names()
    for name in names:
        if name not in known:
            raise ConfigError(
                f"tools: {name!r} is unknown; choose among {list(known)} (or register one under "
                "the lrft.tools entry points)"
            )
    if len(set(names)) != len(names):
        raise ConfigError(f"tools names a tool twice: {list(names)}")
    return names


def json_object(_: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is None:
        return
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{attribute.name} is not valid JSON ({error}): {value!r}") from None
    if not isinstance(parsed, dict):
        raise ConfigError(
            f'{attribute.name} must be a JSON object ({{"name": value, ...}}), got {value!r}'
        )


# split placement and asynchronous training ----------------------------------------------------

PLACEMENTS = ("colocated", "split")
"""Where training and rollout run: on every rank, or on ranks of their own."""


def placement(_: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if value not in PLACEMENTS:
        raise ConfigError(f"{attribute.name} must be one of {list(PLACEMENTS)}, got {value!r}")


optional_non_negative_int = v.optional(v.non_negative_int)
