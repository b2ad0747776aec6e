"""The three Protocols' implementations that a :class:`TrainConfig` names: the train backend,
the rollout engine and the weight sync, each built by :mod:`lrft.backends.registry` from its
kind's spec (:mod:`lrft.api.plugins`), lrft's own and installed packages' alike.

This module turns the config into those specs. An engine's options follow the facts its
registry entry declares (decoding paths: ``hf_decode``; memory reserved up front:
``engine_mem_util``); a train backend's are the settings named after it (``fsdp_*`` for
``fsdp2``, ``zero_stage`` and ``deepspeed_config`` for ``deepspeed``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lrft.api.plugins import EngineSpec, TrainBackendSpec, WeightSyncSpec
from lrft.api.protocols import RolloutEngine, TrainBackend, WeightSync
from lrft.backends import registry
from lrft.backends.sync.direct import DEFAULT_BUCKET_BYTES
from lrft.config import TrainConfig
from lrft.dist import RankInfo, SplitGroups


def _rollout_dtype(info: RankInfo) -> torch.dtype:
    # The dtype the train backends compute in (bf16 mixed precision on CUDA, fp32 on the CPU),
    # so rollouts and training logprobs come from the same numerics.
    return torch.bfloat16 if info.device.type == "cuda" else torch.float32


def engine_memory_share(config: TrainConfig, info: RankInfo) -> float:
    """The fraction of memory an engine that reserves it up front takes on ``info``'s rank."""
    return config.engine_memory_share(
        local_world_size=info.local_world_size, on_cuda=info.device.type == "cuda"
    )


def engine_spec(
    pretrain: str, config: TrainConfig, info: RankInfo, *, samples_per_prompt: int | None = None
) -> EngineSpec:
    """The spec the ``engine_type`` engine serving ``pretrain`` on ``info``'s rank is built
    from; its batches hold ``micro_rollout_batch_size`` prompts of ``samples_per_prompt``
    responses each (default: ``n_samples_per_prompt``)."""
    per_prompt = config.n_samples_per_prompt if samples_per_prompt is None else samples_per_prompt
    facts = registry.engine_facts(config.engine_type)
    options: dict[str, Any] = {}
    if facts is not None and facts.decode_paths:
        options["decode"] = config.hf_decode
    if facts is not None and facts.reserves_memory:
        options["memory_share"] = engine_memory_share(config, info)
    return EngineSpec(
        model_dir=pretrain,
        device=info.device,
        dtype=_rollout_dtype(info),
        tp_size=config.engine_tp_size,
        max_batch_size=config.micro_rollout_batch_size * per_prompt,
        max_model_len=None
        if config.prompt_max_len is None
        else config.prompt_max_len + config.generate_max_len,
        seed=config.seed,
        options=options,
    )


def rollout_engine(
    pretrain: str, config: TrainConfig, info: RankInfo, *, samples_per_prompt: int | None = None
) -> RolloutEngine:
    """The ``engine_type`` engine serving ``pretrain`` on this rank (collective for TP
    engines); ``samples_per_prompt`` as :func:`engine_spec` takes it."""
    spec = engine_spec(pretrain, config, info, samples_per_prompt=samples_per_prompt)
    return registry.build_engine(config.engine_type, spec)


def weight_sync(config: TrainConfig, groups: SplitGroups | None = None) -> WeightSync:
    """The ``weight_sync`` sync: lrft's ``direct``, its ``broadcast`` (over the span groups of
    a split placement, ``groups``), or a registered package's."""
    options = {} if groups is None else {"groups": groups}
    spec = WeightSyncSpec(bucket_bytes=DEFAULT_BUCKET_BYTES, options=options)
    return registry.build_sync(config.weight_sync, spec)


def _train_options(config: TrainConfig) -> dict[str, Any]:
    name = config.train_backend_name
    if name == "fsdp2":
        return {
            "cpu_offload": config.fsdp_cpu_offload,
            "reshard_after_forward": config.fsdp_reshard_after_forward,
            "defer_gradient_sync": config.fsdp_defer_gradient_sync,
        }
    if name == "deepspeed":
        # imported here, as the registry imports the backend: only when deepspeed is chosen
        from lrft.backends.train.deepspeed import read_override

        path = config.deepspeed_config
        return {
            "zero_stage": config.zero_stage,
            "override": {} if path is None else read_override(Path(path)),
        }
    return {}


def train_backend(config: TrainConfig, info: RankInfo | None = None) -> TrainBackend:
    """The train backend ``config`` names (:attr:`TrainConfig.train_backend_name`): FSDP2 by
    default, DeepSpeed ZeRO at ``zero_stage``, or a registered package's (built for ``info``'s
    rank, torchrun's by default)."""
    rank = info if info is not None else RankInfo.from_env()
    spec = TrainBackendSpec(device=rank.device, seed=config.seed, options=_train_options(config))
    return registry.build_train_backend(config.train_backend_name, spec)
