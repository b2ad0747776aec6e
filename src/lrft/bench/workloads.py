"""Benchmark workloads as data: a model config and the settings of each benchmark part.

A workload is a JSON file (the built-in ones ship in ``lrft/bench/workloads/``). Its sections:

- ``model``: a Qwen2 config with random weights drawn from ``seed`` (no hub download); with a
  ``vision`` section, a Qwen2-VL of that language model and vision tower;
- ``grpo``: the end-to-end GRPO loop through ``lrft train``'s own builder: prompts of random
  tokens (with ``prompts.images``, each with one random image), a text-length reward, ``train``, a mapping of ``lrft train`` settings, and optionally
  ``ragged``, responses forced to lengths of a long-tailed distribution;
- ``train_mfu``: the policy update alone on synthetic sequences of a fixed length, or with
  ``ragged`` of ragged lengths, padded and packed side by side;
- ``sync``: weight sync from the trainer into the engine;
- ``sleep``: the engine's sleep levels and waking;
- ``ceilings``: the size of the matmul loop that measures this run's arithmetic ceiling.

Every section but ``model`` and ``ceilings`` is optional; a part runs only on a workload that has
its section. Unknown keys and bad values raise :class:`~lrft.api.errors.ConfigError` naming the
file, the key and the rule.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import attrs

from lrft.api import validators as v
from lrft.api.errors import ConfigError

BUILT_IN = (
    "w1",
    "w2",
    "qwen2-1.5b",
    "tiny",
    "tiny-ragged",
    "w2-ragged",
    "w2-lora",
    "w2-kl",
    "w2-lora-kl",
    "vl1",
    "vl-tiny",
    "cpu-ragged",
)
"""Workload names that resolve to the files shipped in ``lrft/bench/workloads/``."""

PARTS = ("grpo", "train_mfu", "sync", "sleep")
"""The benchmark parts, in the order ``lrft bench all`` runs them."""

MANAGED_TRAIN_KEYS = frozenset(
    {
        "pretrain",
        "prompt_data",
        "reward_fn",
        "save_path",
        "max_steps",
        "eval_dataset",
        "save_hf_model",
        "use_tensorboard",
        "load_checkpoint",
        "save_steps",
    }
)
"""``lrft train`` settings the GRPO part sets itself (model folder, prompts, reward, steps,
outputs); a workload's ``grpo.train`` must leave them out."""
IMAGE_TRAIN_KEYS = frozenset({"images_key", "apply_chat_template", "input_key"})
"""Set by the GRPO part too when its prompts have images."""


def _dtype_name(_: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if value not in ("bfloat16", "float32"):
        raise ConfigError(f"{attribute.name} must be 'bfloat16' or 'float32', got {value!r}")


@attrs.frozen(kw_only=True)
class VisionSpec:
    """A Qwen2-VL vision tower: ``depth`` blocks of width ``embed_dim`` with ``num_heads`` heads,
    patches of ``patch_size`` pixels merged ``spatial_merge_size`` x ``spatial_merge_size`` into
    one token of the language model (the projector maps to its hidden size); the language
    model's m-RoPE splits its rotary frequencies into ``mrope_section`` (time, height, width)."""

    depth: int = attrs.field(validator=v.positive_int)
    embed_dim: int = attrs.field(validator=v.positive_int)
    num_heads: int = attrs.field(validator=v.positive_int)
    mlp_ratio: int = attrs.field(default=4, validator=v.positive_int)
    patch_size: int = attrs.field(default=14, validator=v.positive_int)
    spatial_merge_size: int = attrs.field(default=2, validator=v.positive_int)
    temporal_patch_size: int = attrs.field(default=2, validator=v.positive_int)
    mrope_section: tuple[int, int, int] = attrs.field(converter=tuple)

    def __attrs_post_init__(self) -> None:
        if self.embed_dim % self.num_heads:
            raise ConfigError(
                f"model.vision.embed_dim {self.embed_dim} must be divisible by "
                f"model.vision.num_heads {self.num_heads}"
            )


@attrs.frozen(kw_only=True)
class ModelSpec:
    """A Qwen2 causal LM by its config; weights are transformers' initialisation under ``seed``.
    With ``vision``, a Qwen2-VL whose language model is that Qwen2 (figures such as the MFU
    count the language model only)."""

    hidden_size: int = attrs.field(validator=v.positive_int)
    num_hidden_layers: int = attrs.field(validator=v.positive_int)
    num_attention_heads: int = attrs.field(validator=v.positive_int)
    num_key_value_heads: int = attrs.field(validator=v.positive_int)
    intermediate_size: int = attrs.field(validator=v.positive_int)
    vocab_size: int = attrs.field(validator=v.positive_int)
    tie_word_embeddings: bool
    max_position_embeddings: int = attrs.field(default=4096, validator=v.positive_int)
    seed: int = 0
    saved_dtype: str = attrs.field(default="bfloat16", validator=_dtype_name)
    """The dtype the random weights are rounded to and saved in (W1: bf16, like TRL's model)."""
    vision: VisionSpec | None = None

    def __attrs_post_init__(self) -> None:
        if self.vision is not None and 2 * sum(self.vision.mrope_section) != self.head_dim:
            raise ConfigError(
                f"model.vision.mrope_section {list(self.vision.mrope_section)} must sum to half "
                f"the head dim {self.head_dim} (hidden_size / num_attention_heads)"
            )
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"hidden_size {self.hidden_size} must be divisible by num_attention_heads "
                f"{self.num_attention_heads}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads {self.num_attention_heads} must be divisible by "
                f"num_key_value_heads {self.num_key_value_heads}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


@attrs.frozen(kw_only=True)
class ImageSpec:
    """One RGB image of uniform noise, ``width`` x ``height`` pixels, per prompt, placed before
    its tokens; the processor keeps that size (a model with ``vision`` only)."""

    width: int = attrs.field(validator=v.positive_int)
    height: int = attrs.field(validator=v.positive_int)


@attrs.frozen(kw_only=True)
class PromptSpec:
    """``count`` prompts of exactly ``tokens`` token ids each, drawn from ``seed``; with
    ``images``, each after one image."""

    count: int = attrs.field(validator=v.positive_int)
    tokens: int = attrs.field(validator=v.positive_int)
    seed: int = 0
    images: ImageSpec | None = None


@attrs.frozen(kw_only=True)
class RaggedSpec:
    """Responses forced to lengths drawn log-uniformly from ``min_tokens`` to ``max_tokens``
    (``lrft.bench.ragged``), from ``seed``."""

    min_tokens: int = attrs.field(validator=v.positive_int)
    max_tokens: int = attrs.field(validator=v.positive_int)
    seed: int = 0

    def __attrs_post_init__(self) -> None:
        if self.min_tokens > self.max_tokens:
            raise ConfigError(
                f"grpo.ragged.min_tokens {self.min_tokens} must be <= grpo.ragged.max_tokens "
                f"{self.max_tokens}"
            )


@attrs.frozen(kw_only=True)
class GrpoSpec:
    """The end-to-end loop: ``steps`` iterations; figures are medians of steps ``steady_from``
    to ``steps`` (1-based), the earlier ones being warm-up (allocator, kernels, graphs).
    ``ragged`` forces the responses' lengths (``lrft.bench.ragged``)."""

    prompts: PromptSpec
    steps: int = attrs.field(validator=v.positive_int)
    steady_from: int = attrs.field(validator=v.positive_int)
    train: Mapping[str, Any] = attrs.field(factory=dict)
    ragged: RaggedSpec | None = None

    def __attrs_post_init__(self) -> None:
        if self.steady_from > self.steps:
            raise ConfigError(
                f"grpo.steady_from {self.steady_from} must be <= grpo.steps {self.steps}"
            )
        own = MANAGED_TRAIN_KEYS | (IMAGE_TRAIN_KEYS if self.prompts.images else frozenset())
        managed = sorted(own & set(self.train))
        if managed:
            raise ConfigError(f"grpo.train must not set {managed}: the benchmark sets them itself")
        longest = self.train.get("generate_max_len")
        if self.ragged is not None and longest is not None and self.ragged.max_tokens > longest:
            raise ConfigError(
                f"grpo.ragged.max_tokens {self.ragged.max_tokens} must be <= "
                f"grpo.train.generate_max_len {longest}: a response never exceeds it"
            )


@attrs.frozen(kw_only=True)
class TrainMfuSpec:
    """The policy update on ``sequences`` rows of ``prompt_tokens + response_tokens`` tokens:
    ``warmup_steps`` optimizer steps, then ``steps`` timed ones. ``fsdp_reshard_after_forward``
    and ``fsdp_defer_gradient_sync`` are :class:`~lrft.backends.train.fsdp2.FSDP2Config`'s
    ``reshard_after_forward`` and ``defer_gradient_sync``. With ``ragged``, the responses have
    lengths drawn from it (at most ``response_tokens``) and the update runs padded and packed
    side by side (:mod:`lrft.bench.train_packing`)."""

    sequences: int = attrs.field(validator=v.positive_int)
    prompt_tokens: int = attrs.field(validator=v.positive_int)
    response_tokens: int = attrs.field(validator=v.positive_int)
    micro_train_batch_size: int = attrs.field(validator=v.positive_int)
    steps: int = attrs.field(validator=v.positive_int)
    warmup_steps: int = attrs.field(default=1, validator=v.non_negative)
    gradient_checkpointing: bool = False
    fsdp_reshard_after_forward: bool = True
    fsdp_defer_gradient_sync: bool = False
    ragged: RaggedSpec | None = None

    def __attrs_post_init__(self) -> None:
        if self.sequences % self.micro_train_batch_size:
            raise ConfigError(
                f"train_mfu.sequences {self.sequences} must be a multiple of "
                f"train_mfu.micro_train_batch_size {self.micro_train_batch_size}"
            )
        if self.ragged is not None and self.ragged.max_tokens > self.response_tokens:
            raise ConfigError(
                f"train_mfu.ragged.max_tokens {self.ragged.max_tokens} must be <= "
                f"train_mfu.response_tokens {self.response_tokens}"
            )


@attrs.frozen(kw_only=True)
class SyncSpec:
    """``repeats`` timed rounds of syncs after two warm-up syncs of each kind."""

    repeats: int = attrs.field(validator=v.positive_int)


@attrs.frozen(kw_only=True)
class SleepSpec:
    """``repeats`` timed sleep/wake cycles per level after one warm-up cycle."""

    repeats: int = attrs.field(validator=v.positive_int)


@attrs.frozen(kw_only=True)
class CeilingSpec:
    """The square matmul (``matmul_size``^3, bf16 on CUDA, fp32 on CPU) timed ``repeats`` times."""

    matmul_size: int = attrs.field(validator=v.positive_int)
    repeats: int = attrs.field(validator=v.positive_int)


@attrs.frozen(kw_only=True)
class Workload:
    name: str
    description: str
    model: ModelSpec
    ceilings: CeilingSpec
    grpo: GrpoSpec | None = None
    train_mfu: TrainMfuSpec | None = None
    sync: SyncSpec | None = None
    sleep: SleepSpec | None = None

    @property
    def parts(self) -> tuple[str, ...]:
        """The parts this workload defines, in run order."""
        return tuple(part for part in PARTS if getattr(self, part) is not None)

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


T = TypeVar("T")

_NESTED: dict[type[Any], dict[str, type[Any]]] = {
    Workload: {
        "model": ModelSpec,
        "ceilings": CeilingSpec,
        "grpo": GrpoSpec,
        "train_mfu": TrainMfuSpec,
        "sync": SyncSpec,
        "sleep": SleepSpec,
    },
    GrpoSpec: {"prompts": PromptSpec, "ragged": RaggedSpec},
    TrainMfuSpec: {"ragged": RaggedSpec},
    ModelSpec: {"vision": VisionSpec},
    PromptSpec: {"images": ImageSpec},
}


def _build(cls: type[T], data: object, where: str) -> T:
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping, got {type(data).__name__}")
    fields = attrs.fields_dict(cls)  # type: ignore[arg-type]  # every cls here is an attrs class
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where} has unknown keys {unknown}; known: {sorted(fields)}")
    values = dict(data)
    for key, nested in _NESTED.get(cls, {}).items():
        if values.get(key) is not None:
            values[key] = _build(nested, values[key], f"{where}.{key}")
    try:
        return cls(**values)
    except TypeError as error:  # a missing key or a wrongly typed one
        raise ConfigError(f"{where}: {error}") from error


def workload_from_dict(data: Mapping[str, Any], *, source: str) -> Workload:
    """A validated workload from its JSON mapping; errors name ``source``."""
    workload = _build(Workload, dict(data), source)
    if (
        workload.grpo is not None
        and workload.grpo.prompts.images is not None
        and workload.model.vision is None
    ):
        raise ConfigError(f"{source}: grpo.prompts.images needs a model with a vision section")
    return workload


def load_workload(name_or_path: str) -> Workload:
    """A built-in workload by name (:data:`BUILT_IN`) or a workload JSON file by path."""
    if name_or_path in BUILT_IN:
        text = (resources.files("lrft.bench") / "workloads" / f"{name_or_path}.json").read_text(
            encoding="utf-8"
        )
        source = f"built-in workload {name_or_path!r}"
    else:
        path = Path(name_or_path)
        if not path.is_file():
            raise ConfigError(
                f"workload {name_or_path!r} is neither a built-in one ({', '.join(BUILT_IN)}) "
                "nor a file"
            )
        text = path.read_text(encoding="utf-8")
        source = str(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{source} is not valid JSON: {error}") from error
    if not isinstance(data, dict):
        raise ConfigError(f"{source} must hold a JSON object, got {type(data).__name__}")
    return workload_from_dict(data, source=source)
