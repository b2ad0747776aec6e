"""The typed settings of the ``deepspeed`` backend and the DeepSpeed config dict made from them.

Users never write DeepSpeed JSON to keep in step with lrft: :class:`DeepSpeedConfig` generates the
whole dict. A user's own DeepSpeed JSON can still be merged in (``override``) for settings lrft
has no field for; a key that lrft generates may be repeated only with the value lrft generates,
and keys that would take over what lrft owns (the optimizer, the schedule, loss scaling,
permanent ZeRO-Offload) are refused. Nothing here imports deepspeed.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import attrs

from lrft.api import validators as v
from lrft.api.errors import ConfigError

ZeroStage = Literal[1, 2, 3]

_CALLER_BATCHES = (
    "the caller owns micro-batching: backward() accumulates and step() is the boundary, and lrft "
    "never rescales the loss"
)

# Dotted keys of a user override that lrft refuses outright, with the reason.
_REFUSED_KEYS: dict[str, str] = {
    "optimizer": "lrft builds torch AdamW from OptimizerConfig (a DeepSpeed-config optimizer would "
    "also JIT-compile fused_adam or cpu_adam)",
    "scheduler": "lrft builds the learning-rate schedule from SchedulerConfig",
    "fp16": "lrft computes in bf16 (DeepSpeedConfig.mixed_precision) or fp32, never with fp16 "
    "loss scaling",
    "zero_optimization.offload_optimizer": "permanent ZeRO-Offload is not supported by lrft's "
    "deepspeed backend; offload()/reload() move the optimizer state between phases",
    "zero_optimization.offload_param": "permanent ZeRO-Offload is not supported by lrft's "
    "deepspeed backend; offload()/reload() move the parameters between phases",
    "train_batch_size": _CALLER_BATCHES,
    "train_micro_batch_size_per_gpu": _CALLER_BATCHES,
    "gradient_accumulation_steps": _CALLER_BATCHES,
}

# Where each generated key comes from, for error messages.
_SOURCES: dict[str, str] = {
    "managed_gradient_accumulation": "lrft (step() is the accumulation boundary)",
    "gradient_clipping": "OptimizerConfig.max_grad_norm",
    "bf16.enabled": "DeepSpeedConfig.mixed_precision",
    "zero_optimization.stage": "DeepSpeedConfig.zero_stage",
    "zero_optimization.overlap_comm": "DeepSpeedConfig.overlap_comm",
    "zero_optimization.reduce_bucket_size": "DeepSpeedConfig.reduce_bucket_size",
    "zero_optimization.allgather_bucket_size": "DeepSpeedConfig.allgather_bucket_size",
    "zero_optimization.compute_grad_norm": "lrft (StepReport.grad_norm and the non-finite skip)",
    "zero_optimization.stage3_param_persistence_threshold": (
        "DeepSpeedConfig.param_persistence_threshold"
    ),
    "zero_optimization.stage3_prefetch_bucket_size": "DeepSpeedConfig.prefetch_bucket_size",
    "zero_optimization.stage3_max_live_parameters": "DeepSpeedConfig.max_live_parameters",
}

# DeepSpeed prints a progress line every this many steps; lrft reports through StepReport.
_NEVER = 2**62


def _json_object(value: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``value`` after checking that it is a JSON object."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"a DeepSpeed override must be a JSON object, got {type(value).__name__}")
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"a DeepSpeed override must be plain JSON: {error}") from error
    copied: dict[str, Any] = json.loads(text)
    if copied != value:  # json.dumps turns int keys and tuples into strings and lists
        raise ConfigError("a DeepSpeed override must be plain JSON: string keys, lists, no tuples")
    return copied


def _stage(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value not in (1, 2, 3) or isinstance(value, bool):
        raise ConfigError(f"{attribute.name} must be 1, 2 or 3, got {value!r}")


@attrs.frozen(kw_only=True)
class DeepSpeedConfig:
    """Settings of the ``deepspeed`` backend; :meth:`deepspeed_config` turns them into DeepSpeed's.

    zero_stage: 1 shards the optimizer state, 2 also the gradients, 3 also the parameters.
    mixed_precision: keep bf16 parameters for forward and backward, with fp32 master weights
        and AdamW state in the optimizer (DeepSpeed ``bf16``). ``None`` turns it on where CUDA is
        available; ``True`` without CUDA is an error (gloo on CPU computes in fp32).
    overlap_comm: overlap gradient reduction with the backward pass (stages 2 and 3; stage 1
        reduces once, in ``step()``). ``None`` keeps DeepSpeed's default.
    reduce_bucket_size, allgather_bucket_size: elements per gradient-reduction and
        parameter-all-gather bucket.
    param_persistence_threshold: ZeRO-3 keeps parameters with fewer elements than this whole on
        every rank (saves small all-gathers); 0 shards every parameter.
    prefetch_bucket_size, max_live_parameters: ZeRO-3 prefetch size and the bound on gathered
        parameter elements alive at once.
    frozen_zero3: wrap frozen models (reference, reward) with ZeRO-3 inference, partitioning
        their parameters; otherwise each rank holds a plain replica. ``None`` means
        ``zero_stage == 3``.
    override: a DeepSpeed config (JSON object) merged into the generated one, for settings lrft
        has no field for. It may repeat a generated key only with the generated value; see
        :func:`read_override` to load one from a file.
    """

    zero_stage: ZeroStage = attrs.field(default=2, validator=_stage)
    mixed_precision: bool | None = None
    overlap_comm: bool | None = None
    reduce_bucket_size: int = attrs.field(default=500_000_000, validator=v.positive_int)
    allgather_bucket_size: int = attrs.field(default=500_000_000, validator=v.positive_int)
    param_persistence_threshold: int = attrs.field(default=100_000, validator=v.non_negative_int)
    prefetch_bucket_size: int = attrs.field(default=50_000_000, validator=v.non_negative_int)
    max_live_parameters: int = attrs.field(default=1_000_000_000, validator=v.positive_int)
    frozen_zero3: bool | None = None
    override: dict[str, Any] = attrs.field(factory=dict, converter=_json_object, hash=False)

    def __attrs_post_init__(self) -> None:
        for dotted, reason in _REFUSED_KEYS.items():
            if _lookup(self.override, dotted) is not _MISSING:
                raise ConfigError(f"the DeepSpeed override may not set {dotted!r}: {reason}")
        # Conflicts that do not depend on the model or the world size surface here already.
        self.deepspeed_config(world_size=1, mixed_precision=None, max_grad_norm=None)

    @property
    def partitions_frozen(self) -> bool:
        """Whether frozen models are partitioned with ZeRO-3 inference."""
        return self.zero_stage == 3 if self.frozen_zero3 is None else self.frozen_zero3

    def deepspeed_config(
        self,
        *,
        world_size: int,
        mixed_precision: bool | None,
        max_grad_norm: float | None,
        zero_stage: int | None = None,
    ) -> dict[str, Any]:
        """The DeepSpeed config dict for one wrapped model, with ``override`` merged in.

        ``max_grad_norm`` is ``OptimizerConfig.max_grad_norm`` (``None`` for a frozen model);
        ``zero_stage`` replaces the configured stage (frozen models use 3). ``None`` for
        ``mixed_precision`` or ``max_grad_norm`` leaves that key out (to check an override before
        they are known). Raises ``ConfigError`` when the override contradicts a generated key.
        """
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        stage = self.zero_stage if zero_stage is None else zero_stage
        zero: dict[str, Any] = {
            "stage": stage,
            "reduce_bucket_size": self.reduce_bucket_size,
            "allgather_bucket_size": self.allgather_bucket_size,
            "compute_grad_norm": True,
        }
        if stage == 1:
            # DeepSpeed 0.19.8 refuses overlap_comm at stage 1 when step() owns the boundary.
            zero["overlap_comm"] = False
        elif self.overlap_comm is not None:
            zero["overlap_comm"] = self.overlap_comm
        if stage == 3:
            zero["stage3_param_persistence_threshold"] = self.param_persistence_threshold
            zero["stage3_prefetch_bucket_size"] = self.prefetch_bucket_size
            zero["stage3_max_live_parameters"] = self.max_live_parameters
        generated: dict[str, Any] = {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "train_batch_size": world_size,
            # step() is the accumulation boundary: backward() only accumulates (stages 2 and 3
            # reduce-scatter as they go) and nothing divides the loss by an accumulation count.
            "managed_gradient_accumulation": False,
            "zero_optimization": zero,
            "steps_per_print": _NEVER,
            "wall_clock_breakdown": False,
        }
        if mixed_precision is not None:
            generated["bf16"] = {"enabled": mixed_precision}
        if max_grad_norm is not None:
            clip = max_grad_norm if math.isfinite(max_grad_norm) and max_grad_norm > 0 else 0.0
            generated["gradient_clipping"] = clip
        return merge_override(generated, self.override)


class _Missing:
    pass


_MISSING = _Missing()


def _lookup(config: Mapping[str, Any], dotted: str) -> object:
    node: object = config
    for key in dotted.split("."):
        if not isinstance(node, Mapping) or key not in node:
            return _MISSING
        node = node[key]
    return node


def merge_override(generated: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``generated`` with ``override`` merged in, key by key and recursively into objects.

    A key only in ``override`` is added. A key in both must hold equal values (or objects, which
    are merged in turn); otherwise ``ConfigError`` names the key, both values and the lrft
    setting that generates it.
    """
    merged = copy.deepcopy(dict(generated))
    _merge_into(merged, override, prefix="")
    return merged


def _merge_into(target: dict[str, Any], override: Mapping[str, Any], *, prefix: str) -> None:
    for key, value in override.items():
        dotted = f"{prefix}{key}"
        if key not in target:
            target[key] = copy.deepcopy(value)
            continue
        current = target[key]
        if isinstance(current, dict) and isinstance(value, Mapping):
            _merge_into(current, value, prefix=f"{dotted}.")
        elif not _same_json(current, value):
            source = _SOURCES.get(dotted, "lrft")
            raise ConfigError(
                f"the DeepSpeed override sets {dotted}={value!r}, but lrft generates "
                f"{dotted}={current!r} from {source}: change that setting instead, or drop the key"
            )


def _same_json(a: object, b: object) -> bool:
    # JSON has one number type: 1 and 1.0 agree, but true and 1 do not.
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def read_override(path: Path) -> dict[str, Any]:
    """The JSON object in the file at ``path``, for ``DeepSpeedConfig(override=...)``."""
    try:
        value = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path} is not valid JSON: {error}") from error
    if not isinstance(value, dict):
        raise ConfigError(f"{path} must hold a JSON object, got {type(value).__name__}")
    return _json_object(value)
