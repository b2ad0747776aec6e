"""How a wrapped model's parameters become the full weights its handle yields, which of them
training changes, and a fingerprint of the others.

Each parameter is one weight under its Hugging Face name, except in a model with LoRA adapters
(peft): there each adapted module yields one merged weight, ``base + (lora_alpha / r) * B @ A``
under the base model's name, and its adapters' own parameters never appear. The weights that
depend on a parameter that requires grad are the *varying* ones (``IncrementalWeightSource``);
the others are fingerprinted where their parameters live, on every rank, to tell whether
something wrote to them since the last pass.

peft is imported only for a model that is a peft model.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import attrs
import numpy as np
import torch
import torch.distributed as dist

from lrft.api.errors import LrftError
from lrft.api.types import WeightsMark, WeightsUpdate
from lrft.backends.train._names import hf_name
from lrft.dist.collectives import all_gather_into
from lrft.kernels import digest_sums_many

_PEFT_PREFIX = "base_model.model."
# Parameters of peft features whose merge lrft does not implement; their names say which.
_UNSUPPORTED_SEGMENTS = ("modules_to_save", "original_module", "lora_magnitude_vector")


@attrs.frozen(kw_only=True)
class Unit:
    """One weight of the full weights: its Hugging Face name and the parameters it is made of
    (indices into the model's ``named_parameters()``): one for a plain weight, or the base
    weight, ``lora_A`` and ``lora_B`` of an adapted module, merged with ``scaling``."""

    name: str
    sources: tuple[int, ...]
    scaling: float = 0.0
    varying: bool = False

    @property
    def merged(self) -> bool:
        return len(self.sources) == 3


@attrs.frozen(kw_only=True)
class _Adapted:
    adapter: str
    scaling: float


def is_peft_model(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a peft model (wrapped by FSDP2 or not): it carries ``peft_config``."""
    return isinstance(getattr(module, "peft_config", None), dict)


def _adapted_modules(module: torch.nn.Module) -> dict[str, _Adapted]:
    """The LoRA layers of a peft model by module path, with their one active adapter."""
    from peft.tuners.lora import LoraLayer

    found: dict[str, _Adapted] = {}
    for path, layer in module.named_modules():
        if not isinstance(layer, LoraLayer):
            continue
        adapters = list(layer.active_adapters)
        if len(adapters) != 1:
            raise LrftError(f"LoRA layer {path} has active adapters {adapters}: lrft needs one")
        adapter = adapters[0]
        base = layer.get_base_layer()
        if type(base) is not torch.nn.Linear or adapter not in layer.lora_A:
            raise LrftError(
                f"LoRA layer {path} adapts a {type(base).__name__}: lrft merges adapters of "
                "torch.nn.Linear modules only"
            )
        if layer.merged or layer.use_dora.get(adapter, False) or layer.lora_bias.get(adapter):
            raise LrftError(
                f"LoRA layer {path} is merged already, or uses DoRA or a LoRA bias: lrft merges "
                "plain, unmerged LoRA adapters only"
            )
        if getattr(layer, "fan_in_fan_out", False):
            raise LrftError(f"LoRA layer {path} stores its base weight transposed (fan_in_fan_out)")
        found[path] = _Adapted(adapter=adapter, scaling=float(layer.scaling[adapter]))
    return found


def weights_units(
    module: torch.nn.Module, names: Sequence[str], params: Sequence[torch.Tensor]
) -> list[Unit]:
    """The weights ``module`` yields, in the order of its parameters (``names`` and ``params``
    as its ``named_parameters()`` gives them). Raises ``LrftError`` for a peft model whose
    adapters lrft cannot merge."""
    if not is_peft_model(module):
        return [
            Unit(name=hf_name(name), sources=(i,), varying=param.requires_grad)
            for i, (name, param) in enumerate(zip(names, params, strict=True))
        ]
    for name in names:
        for segment in _UNSUPPORTED_SEGMENTS:
            if segment in name.split("."):
                raise LrftError(f"peft parameter {name}: {segment} is not supported by lrft")
    adapted = _adapted_modules(module)
    index = {name: i for i, name in enumerate(names)}
    consumed: set[int] = set()
    for path, layer in adapted.items():
        for kind in ("lora_A", "lora_B"):
            consumed.add(index[f"{path}.{kind}.{layer.adapter}.weight"])
    units = []
    for i, name in enumerate(names):
        if i in consumed:
            continue
        path, _, leaf = name.rpartition(".")
        owner = path.removesuffix(".base_layer")
        base_of = adapted.get(owner) if path.endswith(".base_layer") else None
        out = _base_name(f"{owner}.{leaf}" if base_of is not None else name)
        if base_of is not None and leaf == "weight":
            a = index[f"{owner}.lora_A.{base_of.adapter}.weight"]
            b = index[f"{owner}.lora_B.{base_of.adapter}.weight"]
            sources = (i, a, b)
            units.append(
                Unit(
                    name=out,
                    sources=sources,
                    scaling=base_of.scaling,
                    varying=any(params[j].requires_grad for j in sources),
                )
            )
        else:
            units.append(Unit(name=out, sources=(i,), varying=params[i].requires_grad))
    return units


def _base_name(name: str) -> str:
    """A peft model's parameter name as the base model names it."""
    return hf_name(name).removeprefix(_PEFT_PREFIX)


@torch.no_grad()
def merge(
    weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float
) -> torch.Tensor:
    """``weight + (lora_b @ lora_a) * scaling``, computed in float32 at least, in ``weight``'s
    dtype: a new tensor (``weight`` may be a live parameter)."""
    compute = torch.promote_types(weight.dtype, torch.float32)
    delta = (lora_b.to(compute) @ lora_a.to(compute)) * scaling
    return (weight.to(compute) + delta).to(weight.dtype)


def unit_tensor(unit: Unit, full: Sequence[torch.Tensor]) -> torch.Tensor:
    """The weight ``unit`` yields from its sources' full tensors (in ``unit.sources`` order)."""
    if unit.merged:
        return merge(full[0], full[1], full[2], unit.scaling)
    return full[0]


def pack_units(units: Sequence[Unit], sizes: Sequence[int], bucket_bytes: int) -> list[list[Unit]]:
    """Greedy in-order buckets of ``units`` whose yielded sizes are ``sizes`` bytes (a unit
    larger than the bound travels alone)."""
    buckets: list[list[Unit]] = []
    bucket: list[Unit] = []
    size = 0
    for unit, nbytes in zip(units, sizes, strict=True):
        if bucket and size + nbytes > bucket_bytes:
            buckets.append(bucket)
            bucket, size = [], 0
        bucket.append(unit)
        size += nbytes
    if bucket:
        buckets.append(bucket)
    return buckets


class WeightMarks:
    """``weights_mark`` of a handle: the varying weights' names and the fingerprint of the
    frozen parameters' storage on every rank, gathered into one digest."""

    def __init__(self, units: Sequence[Unit], device: torch.device) -> None:
        self._device = device
        self.varying = frozenset(unit.name for unit in units if unit.varying)
        self.has_frozen = len(self.varying) < len(units)

    def update(self, held: WeightsMark | None, frozen: Sequence[torch.Tensor]) -> WeightsUpdate:
        """The mark now and the decision ``varying_only``, the same on every rank. Collective
        when some weights are frozen (``frozen``: this rank's storage of their parameters)."""
        if not self.has_frozen:
            # Nothing is ever skipped: no fingerprint, no collective (every rank knows it).
            return WeightsUpdate(
                mark=WeightsMark(varying=self.varying, frozen_digest=""), varying_only=False
            )
        holds = held is not None and held.varying == self.varying
        claimed = _digest_words(held.frozen_digest if holds and held is not None else "")
        local = torch.cat(
            (_sums(frozen, self._device), torch.tensor([[int(holds), 0], claimed]).to(self._device))
        )
        world = dist.get_world_size() if dist.is_initialized() else 1
        rows = local
        if world > 1:
            rows = torch.empty((world * local.shape[0], 2), dtype=local.dtype, device=self._device)
            all_gather_into(rows, local)  # the collective's current name, without its warning
        per_rank = rows.to("cpu").reshape(world, local.shape[0], 2)
        digest = hashlib.sha256(per_rank[:, :-2].contiguous().numpy().tobytes()).hexdigest()[:32]
        expected = torch.tensor(_digest_words(digest))
        varying_only = bool((per_rank[:, -2, 0] == 1).all()) and bool(
            (per_rank[:, -1] == expected).all()
        )
        return WeightsUpdate(
            mark=WeightsMark(varying=self.varying, frozen_digest=digest), varying_only=varying_only
        )


def _digest_words(digest: str) -> list[int]:
    """A digest's 32 hex digits as two int64 words (zeros for none), to travel in a tensor."""
    if not digest:
        return [0, 0]
    raw = np.frombuffer(bytes.fromhex(digest[:32]), dtype=">i8").astype(np.int64)
    return [int(word) for word in raw]


def _sums(tensors: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The fingerprint sums of ``tensors`` (wherever each lives), in their order, on ``device``."""
    out = torch.zeros((len(tensors), 2), dtype=torch.int64, device=device)
    groups: dict[torch.device, list[int]] = {}
    for i, tensor in enumerate(tensors):
        groups.setdefault(tensor.device, []).append(i)
    for indices in groups.values():
        sums = digest_sums_many([tensors[i].detach() for i in indices]).to(device)
        out[torch.tensor(indices, device=device)] = sums
    return out
