"""How lrft's own backends are built from their specs: the builders their registry entries name
(:mod:`lrft.backends.registry`), each reading the options its backend alone takes.

deepspeed and vllm are optional: their adapters are imported inside their builders, which the
registry calls only once it has imported the backend's class (so a missing package's error
names its extra first).
"""

from __future__ import annotations

import attrs

from lrft.api.errors import ConfigError
from lrft.api.plugins import EngineSpec, TrainBackendSpec, WeightSyncSpec, read_options
from lrft.api.protocols import RolloutEngine, TrainBackend, WeightSync
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.backends.sync.direct import DirectSync
from lrft.backends.train._deepspeed_config import DeepSpeedConfig
from lrft.backends.train.fsdp2 import FSDP2Backend, FSDP2Config
from lrft.dist import SplitGroups

# The options' values are checked by the engines' own configs, which they are handed to.


@attrs.frozen(kw_only=True)
class HFEngineOptions:
    """The hf engine's own option: ``decode``, its decoding path (``HFEngineConfig.decode``)."""

    decode: str = "auto"


@attrs.frozen(kw_only=True)
class VLLMEngineOptions:
    """The vllm engine's own option: ``memory_share``, the fraction of the device (on CPU, of
    the host) it reserves up front (``VLLMEngineConfig.gpu_memory_utilization``)."""

    memory_share: float = 0.5


def hf_engine(spec: EngineSpec) -> RolloutEngine:
    options = read_options(HFEngineOptions, spec.options, backend="rollout engine 'hf'")
    config = HFEngineConfig(
        dtype=spec.dtype,
        device=spec.device,
        max_batch_size=spec.max_batch_size,
        decode=options.decode,
    )
    return HFRolloutEngine.from_pretrained(spec.model_dir, config=config)


def vllm_engine(spec: EngineSpec) -> RolloutEngine:
    """One vLLM engine per TP group of consecutive ranks; collective over the default group."""
    from lrft.backends.rollout.vllm import VLLMEngineConfig, VLLMRolloutEngine

    options = read_options(VLLMEngineOptions, spec.options, backend="rollout engine 'vllm'")
    config = VLLMEngineConfig(
        dtype=spec.dtype,
        tp_size=spec.tp_size,
        max_model_len=spec.max_model_len,
        # the group's ranks hand their chunks to one engine
        max_num_seqs=spec.max_batch_size * spec.tp_size,
        gpu_memory_utilization=options.memory_share,
        seed=spec.seed,
    )
    return VLLMRolloutEngine(spec.model_dir, config=config)


def fsdp2(spec: TrainBackendSpec) -> TrainBackend:
    # FSDP2 places itself on torchrun's LOCAL_RANK device, the spec's device.
    return FSDP2Backend(read_options(FSDP2Config, spec.options, backend="train backend 'fsdp2'"))


def deepspeed(spec: TrainBackendSpec) -> TrainBackend:
    from lrft.backends.train.deepspeed import DeepSpeedBackend

    backend = "train backend 'deepspeed'"
    return DeepSpeedBackend(read_options(DeepSpeedConfig, spec.options, backend=backend))


def direct(spec: WeightSyncSpec) -> WeightSync:
    return DirectSync(bucket_bytes=spec.bucket_bytes, verify=spec.verify)


@attrs.frozen(kw_only=True)
class _BroadcastOptions:
    groups: SplitGroups | None = None


def broadcast(spec: WeightSyncSpec) -> WeightSync:
    """The broadcast sync over a split placement's span groups (its ``groups`` option)."""
    options = read_options(_BroadcastOptions, spec.options, backend="sync backend 'broadcast'")
    if options.groups is None:
        raise ConfigError(
            "weight_sync 'broadcast' sends to the rollout ranks of a split placement: it needs "
            "--placement split"
        )
    from lrft.backends.sync.broadcast import BroadcastSync

    return BroadcastSync(groups=options.groups, bucket_bytes=spec.bucket_bytes, verify=spec.verify)
