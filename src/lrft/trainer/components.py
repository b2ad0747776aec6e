"""The three Protocols' implementations that a :class:`TrainConfig` names, built through
:mod:`lrft.backends.registry`: the train backend, the rollout engine and the weight sync."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch

from lrft.api.errors import ConfigError
from lrft.api.plugins import EngineSpec, TrainBackendSpec, WeightSyncSpec
from lrft.api.protocols import RolloutEngine, TrainBackend, WeightSync
from lrft.backends import registry
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.backends.sync.broadcast import BroadcastSync
from lrft.backends.sync.direct import DEFAULT_BUCKET_BYTES, DirectSync
from lrft.backends.train.fsdp2 import FSDP2Backend, FSDP2Config
from lrft.config import TrainConfig
from lrft.dist import RankInfo, SplitGroups
from lrft.trainer.plugins import plugin_engine, plugin_sync, plugin_train_backend

if TYPE_CHECKING:
    from lrft.backends.train.deepspeed import ZeroStage


def _rollout_dtype(info: RankInfo) -> torch.dtype:
    # The dtype the train backends compute in (bf16 mixed precision on CUDA, fp32 on the CPU),
    # so rollouts and training logprobs come from the same numerics.
    return torch.bfloat16 if info.device.type == "cuda" else torch.float32


def _hf_engine(pretrain: str, config: TrainConfig, info: RankInfo) -> RolloutEngine:
    chunk = config.micro_rollout_batch_size * config.n_samples_per_prompt
    engine_config = HFEngineConfig(
        dtype=_rollout_dtype(info), max_batch_size=chunk, decode=config.hf_decode
    )
    return HFRolloutEngine.from_pretrained(pretrain, config=engine_config)


def _vllm_engine(pretrain: str, config: TrainConfig, info: RankInfo) -> RolloutEngine:
    """One vLLM engine per TP group of consecutive ranks; collective over the default group."""
    # imported here: vllm is an optional dependency and lrft never imports it unasked
    from lrft.backends.rollout.vllm import VLLMEngineConfig, VLLMRolloutEngine

    chunk = config.micro_rollout_batch_size * config.n_samples_per_prompt
    engine_config = VLLMEngineConfig(
        dtype=_rollout_dtype(info),
        tp_size=config.engine_tp_size,
        max_model_len=(
            None
            if config.prompt_max_len is None
            else config.prompt_max_len + config.generate_max_len
        ),
        # the group's ranks hand their chunks to one engine
        max_num_seqs=chunk * config.engine_tp_size,
        gpu_memory_utilization=engine_memory_share(config, info),
        seed=config.seed,
    )
    return VLLMRolloutEngine(pretrain, config=engine_config)


def engine_memory_share(config: TrainConfig, info: RankInfo) -> float:
    return config.engine_memory_share(
        local_world_size=info.local_world_size, on_cuda=info.device.type == "cuda"
    )


ENGINES: dict[str, Callable[[str, TrainConfig, RankInfo], RolloutEngine]] = {
    "hf": _hf_engine,
    "vllm": _vllm_engine,
}
"""lrft's own rollout engines, built from their own settings; each must be listed in
``ENGINE_MAX_TP``. Any other registered engine is built from its :class:`EngineSpec`."""


def rollout_engine(pretrain: str, config: TrainConfig, info: RankInfo) -> RolloutEngine:
    """The ``engine_type`` engine serving ``pretrain`` on this rank (collective for TP
    engines)."""
    registry.load("rollout", config.engine_type)  # a missing package's error names its extra
    build = ENGINES.get(config.engine_type)
    if build is not None:
        return build(pretrain, config, info)
    spec = EngineSpec(
        model_dir=pretrain,
        device=info.device,
        dtype=_rollout_dtype(info),
        tp_size=config.engine_tp_size,
        max_batch_size=config.micro_rollout_batch_size * config.n_samples_per_prompt,
        max_model_len=None
        if config.prompt_max_len is None
        else config.prompt_max_len + config.generate_max_len,
        seed=config.seed,
    )
    return plugin_engine(config.engine_type, spec)


def weight_sync(config: TrainConfig, groups: SplitGroups | None = None) -> WeightSync:
    """The ``weight_sync`` sync: lrft's ``direct``, its ``broadcast`` (over the span groups of
    a split placement, ``groups``), or a registered package's."""
    if config.weight_sync == "direct":
        return DirectSync()
    if config.weight_sync == "broadcast":
        if groups is None:
            raise ConfigError(
                "weight_sync 'broadcast' sends to the rollout ranks of a split placement: it "
                "needs --placement split"
            )
        return BroadcastSync(groups=groups)
    return plugin_sync(config.weight_sync, WeightSyncSpec(bucket_bytes=DEFAULT_BUCKET_BYTES))


def train_backend(config: TrainConfig, info: RankInfo | None = None) -> TrainBackend:
    """The train backend ``config`` names (:attr:`TrainConfig.train_backend_name`): FSDP2 by
    default, DeepSpeed ZeRO at ``zero_stage``, or a registered package's (built for ``info``'s
    rank, torchrun's by default)."""
    name = config.train_backend_name
    registry.load("train", name)  # a missing package's error names its extra
    if name not in ("fsdp2", "deepspeed"):
        rank = info if info is not None else RankInfo.from_env()
        return plugin_train_backend(name, TrainBackendSpec(device=rank.device, seed=config.seed))
    if name == "fsdp2":
        return FSDP2Backend(
            FSDP2Config(
                cpu_offload=config.fsdp_cpu_offload,
                reshard_after_forward=config.fsdp_reshard_after_forward,
                defer_gradient_sync=config.fsdp_defer_gradient_sync,
            )
        )
    # imported here: deepspeed is an optional dependency and lrft never imports it unasked
    from lrft.backends.train.deepspeed import DeepSpeedBackend, DeepSpeedConfig, read_override

    override = (
        {} if config.deepspeed_config is None else read_override(Path(config.deepspeed_config))
    )
    stage = cast("ZeroStage", config.zero_stage)
    return DeepSpeedBackend(DeepSpeedConfig(zero_stage=stage, override=override))
