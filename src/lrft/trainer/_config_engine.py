"""The rollout engine's settings in :class:`lrft.trainer.config.TrainConfig`: which engines
exist, what each needs installed, and how much memory the vllm engine reserves."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from lrft.api.errors import ConfigError

if TYPE_CHECKING:
    from lrft.trainer.config import TrainConfig

EngineType = Literal["hf", "vllm"]
ENGINE_MAX_TP: dict[str, int | None] = {"hf": 1, "vllm": None}
"""The largest tensor-parallel size each built-in engine supports (its ``max_tp`` capability);
``None``: any size that divides the world size."""
HF_DECODE_PATHS = ("auto", "generate", "static", "cuda_graph", "compiled")
"""The hf engine's decoding paths (``HFEngineConfig.decode``)."""
VLLM_EXTRA = "pip install 'lrft[vllm]'"
DEFAULT_ENGINE_MEM_UTIL = 0.5
"""The vllm engine's share of a device when ``engine_mem_util`` is unset (LightRFT's default):
the other half stays with training."""
CPU_KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
"""vLLM's CPU KV-cache size in GiB; when set, vLLM 0.32 never reads ``gpu_memory_utilization``."""


def vllm_available() -> bool:
    """Whether vllm is installed (looked up, not imported: importing vllm takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


def check_engine_settings(config: TrainConfig) -> None:
    """The engine can run at ``engine_tp_size``, is installed, and reads ``engine_mem_util``."""
    max_tp = ENGINE_MAX_TP[config.engine_type]
    if max_tp is not None and config.engine_tp_size > max_tp:
        raise ConfigError(
            f"engine_tp_size {config.engine_tp_size} exceeds engine {config.engine_type!r}'s "
            f"maximum tensor-parallel size {max_tp}"
        )
    if config.engine_type == "vllm" and not vllm_available():
        raise ConfigError(
            f"engine_type 'vllm' needs the vllm package, which is not installed: {VLLM_EXTRA}"
        )
    if config.hf_decode != "auto" and config.engine_type != "hf":
        raise ConfigError(
            f"hf_decode {config.hf_decode!r} picks the hf engine's decoding path, but "
            f"engine_type is {config.engine_type!r}: leave hf_decode at 'auto'"
        )
    if config.engine_mem_util is not None and config.engine_type != "vllm":
        raise ConfigError(
            f"engine_mem_util {config.engine_mem_util} sizes the memory the vllm engine reserves "
            f"up front; engine {config.engine_type!r} reserves none (it allocates as it "
            "generates): leave engine_mem_util unset or use engine_type vllm"
        )


def engine_memory_share(
    config: TrainConfig, *, local_world_size: int, on_cuda: bool, environ: Mapping[str, str]
) -> float:
    """See :meth:`lrft.trainer.config.TrainConfig.engine_memory_share`."""
    share = config.engine_mem_util
    if on_cuda:
        return DEFAULT_ENGINE_MEM_UTIL if share is None else share
    if share is None:
        return DEFAULT_ENGINE_MEM_UTIL / local_world_size
    if environ.get(CPU_KV_CACHE_ENV, "") != "":
        raise ConfigError(
            f"engine_mem_util {share} would be ignored: {CPU_KV_CACHE_ENV}="
            f"{environ[CPU_KV_CACHE_ENV]} is set, and vLLM's CPU backend then sizes its KV "
            f"cache from it alone; unset one of them"
        )
    if share * local_world_size > 1.0:
        raise ConfigError(
            f"engine_mem_util {share} x {local_world_size} ranks on this host = "
            f"{share * local_world_size:.2f} of the host's memory: on CPU the ranks of a host "
            "share its memory, so engine_mem_util x ranks per host must be <= 1"
        )
    return share
