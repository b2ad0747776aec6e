"""``vllm`` rollout engine: one vLLM ``LLM`` per rank in SPMD mode (``external_launcher``).

Every rank of a ``RolloutLayout`` builds its engine at the same time (a collective over the
default process group). The ranks of one TP group form one vLLM engine; the TP groups are vLLM's
data-parallel ranks (``data_parallel_size = world_size / tp_size``), which is how vLLM 0.32 runs
a dense model once per TP group under torchrun. ``generate`` gathers the TP group's requests,
generates them once and hands each rank its own results. With more than one TP group, vLLM steps
the groups' engines in lockstep, so ``generate`` is then collective over every rank of the world
(each calls it equally often, with or without requests).

Weights: an update ships Hugging Face tensors to vLLM's own in-place reload
(``worker.reload_weights``), one call per loaded batch. vLLM loads a module (q/k/v fused into
``qkv_proj``, gate/up into ``gate_up_proj``, weight with bias) only when all its tensors come
together, so tensors of a module whose other members have not arrived yet are held until they
do; at the end of an update (or when the digest is read inside it) an incomplete module is
completed with the engine's current values. ``weights_digest`` reads the weights back from the
worker as the engine computes with them (see ``_vllm_compat.read_local_parameters``), gathers
TP shards and splits fused modules into Hugging Face tensors.

Memory: lrft's levels map onto vLLM's ``sleep(1)`` / ``sleep(2)`` and ``wake_up(["weights"])``
then ``wake_up(["kv_cache"])`` on CUDA. vLLM's CPU worker ignores sleep (0.32), so on CPU the
adapter declares ``sleep_frees_memory=False`` and only the state machine applies.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.distributed as dist

from lrft.api import validators as v
from lrft.api.capabilities import EngineCapabilities
from lrft.api.digest import format_digests
from lrft.api.errors import CapabilityNotSupported
from lrft.api.protocols import WeightLoader
from lrft.api.types import (
    FinishReason,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    TensorSpec,
    WeightsResidency,
)
from lrft.backends.rollout import _vllm_compat as compat
from lrft.backends.rollout._engine_base import EngineAdapter, caller_rng_kept, default_device
from lrft.backends.rollout._lifecycle import EngineLifecycle, SleepPlan, WakePlan
from lrft.backends.rollout._vllm_layout import VLLMParam, describe_param, full_shape
from lrft.dist.collectives import all_gather_objects, broadcast_object
from lrft.dist.layout import RolloutLayout
from lrft.kernels import digest_sums_many


@attrs.frozen(kw_only=True)
class VLLMEngineConfig:
    """Settings of the ``vllm`` engine.

    dtype: the dtype vLLM stores and computes in; ``None`` keeps the checkpoint's.
    tp_size: ranks per engine (one TP group of ``RolloutLayout(world_size, tp_size)``).
    max_model_len: longest prompt + completion; bounds the KV cache per sequence. ``None``: the
        model's own maximum (``max_position_embeddings``).
    max_num_seqs: sequences vLLM schedules at once.
    gpu_memory_utilization: on CUDA, the fraction of the GPU vLLM may use (weights, activations,
        KV cache). On CPU vLLM 0.32 reads it as the fraction of the host's (NUMA node's) memory
        this process may grow to; the KV cache gets that minus what the process already holds.
        ``VLLM_CPU_KVCACHE_SPACE`` (GiB), when set, sizes the CPU KV cache instead.
    seed: vLLM's engine seed (requests without a seed sample from it).
    """

    dtype: torch.dtype | None = None
    tp_size: int = attrs.field(default=1, validator=v.positive_number)
    max_model_len: int | None = attrs.field(default=512, validator=v.optional(v.positive_number))
    max_num_seqs: int = attrs.field(default=64, validator=v.positive_number)
    gpu_memory_utilization: float = attrs.field(default=0.5, validator=v.unit_interval_open_closed)
    seed: int = 0


class VLLMRolloutEngine(EngineAdapter):
    """A ``RolloutEngine`` (structurally) on vLLM in SPMD mode; see ``lrft.api`` and the module
    docstring. Construction is collective over the default process group (when there is one)."""

    def __init__(
        self, model_dir: str | os.PathLike[str], *, config: VLLMEngineConfig | None = None
    ) -> None:
        self.config = config if config is not None else VLLMEngineConfig()
        _refuse_media_models(Path(model_dir))
        self._tp_group: dist.ProcessGroup | None = None
        world, rank = 1, 0
        if dist.is_initialized():
            world, rank = dist.get_world_size(), dist.get_rank()
        layout = RolloutLayout(world_size=world, tp_size=self.config.tp_size)
        self._dp_size = layout.dp_size
        if world > 1:
            self._tp_group = layout.build_groups().tp_group
        self._device = default_device()
        compat.launcher_environment(rank, world, self._device.index or 0)
        on_cuda = self._device.type == "cuda"
        if not on_cuda:
            token = secrets.token_hex(4)
            if world > 1:
                token = broadcast_object(token if rank == 0 else None, src=0)
            compat.prefix_cpu_shared_memory(token)
        self._llm: Any = compat.build_llm(
            Path(model_dir),
            dtype=self.config.dtype,
            tp_size=self.config.tp_size,
            dp_size=layout.dp_size,
            seed=self.config.seed,
            max_model_len=self.config.max_model_len,
            max_num_seqs=self.config.max_num_seqs,
            gpu_memory_utilization=self.config.gpu_memory_utilization,
            sleep_mode=on_cuda,
        )
        compat.collective_rpc(self._llm, compat.install_temperature_logprobs)
        [described] = compat.collective_rpc(self._llm, compat.describe_parameters)
        self._params = [describe_param(entry) for entry in described]
        specs = self._hf_specs(described)
        aliases = {}
        if "lm_head.weight" not in specs and "model.embed_tokens.weight" in specs:
            aliases["lm_head.weight"] = "model.embed_tokens.weight"  # tied embeddings
        self._group_of = {
            hf: param.vllm_name.rsplit(".", 1)[0] for param in self._params for hf in param.hf_names
        }
        self._pending: dict[str, torch.Tensor] = {}
        capabilities = EngineCapabilities(
            sleep_levels={1, 2},
            sleep_frees_memory=on_cuda,
            max_tp=layout.world_size,
            returns_logprobs=True,
        )
        self._lifecycle = EngineLifecycle(
            backend=self.name, capabilities=capabilities, specs=specs, aliases=aliases
        )

    def _hf_specs(self, described: list[dict[str, Any]]) -> dict[str, TensorSpec]:
        specs = {}
        for param, entry in zip(self._params, described, strict=True):
            local = tuple(entry["local_shape"])
            tp = int(entry["tp_size"])
            for index, name in enumerate(param.hf_names):
                specs[name] = TensorSpec(
                    shape=full_shape(param, local, tp, index), dtype=entry["dtype"]
                )
        return specs

    # --- description -------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return "vllm"

    @property
    def llm(self) -> Any:
        """The wrapped ``vllm.LLM`` (for backdoor reads in tests and advanced callers)."""
        self._lifecycle.check_open()
        return self._llm

    # --- generation --------------------------------------------------------------------------

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        """Collective over the TP group; see ``RolloutEngine.generate``."""
        self._lifecycle.check_can_generate(requests)
        batch = (list(requests), params)
        if self._tp_group is None or dist.get_world_size(self._tp_group) == 1:
            return self._generate_batches([batch])[0]
        # Every rank of the group must hand vLLM the same work: gather each rank's requests
        # with its own sampling parameters, generate them all once, keep this rank's.
        batches = all_gather_objects(batch, self._tp_group)
        return self._generate_batches(batches)[dist.get_rank(self._tp_group)]

    def _generate_batches(
        self, batches: Sequence[tuple[list[GenerationRequest], SamplingParams]]
    ) -> list[list[GenerationResult]]:
        from vllm.inputs import TokensPrompt

        prompts, sampling, owners = [], [], []
        for batch_index, (requests, params) in enumerate(batches):
            # vLLM refuses n > 1 with greedy sampling; greedy samples are identical, so each
            # is its own request.
            copies = params.n if params.greedy else 1
            per_copy = attrs.evolve(params, n=1) if copies > 1 else params
            # one vLLM SamplingParams per distinct request cap (vLLM takes one per prompt)
            by_cap: dict[int, Any] = {}
            for request in requests:
                capped = request.capped(per_copy)
                if capped.max_new_tokens not in by_cap:
                    by_cap[capped.max_new_tokens] = compat.sampling_params(capped)
                for _ in range(copies):
                    prompts.append(TokensPrompt(prompt_token_ids=list(request.prompt_token_ids)))
                    sampling.append(by_cap[capped.max_new_tokens])
                    owners.append(batch_index)
        seeded = any(params.seed is not None for _, params in batches)
        # vLLM 0.32's CPU sampler draws per-row seeds from the global generator even for seeded
        # requests: a seeded generate leaves the caller's random streams as they were.
        with caller_rng_kept(self._device) if seeded else nullcontext():
            # 0.32's external-launcher data parallelism steps the TP groups' engines in lockstep
            # (an idle one runs dummy batches until every group is done), so with more than one
            # group each engine takes part even with nothing to generate.
            outputs = (
                self._llm.generate(prompts, sampling, use_tqdm=False)
                if prompts or self._dp_size > 1
                else []
            )
        completions: list[list[Any]] = [[] for _ in batches]
        for owner, output in zip(owners, outputs, strict=True):
            completions[owner].extend(sorted(output.outputs, key=lambda c: c.index))
        return [
            _results(requests, params, done)
            for (requests, params), done in zip(batches, completions, strict=True)
        ]

    # --- memory ------------------------------------------------------------------------------

    def _sleep(self, plan: SleepPlan) -> None:
        if self.capabilities.sleep_frees_memory:
            if plan.weights_from is WeightsResidency.PARKED and plan.moves_weights:
                # deepening 1 -> 2: vLLM sleeps once; wake the parked weights, then drop them
                compat.wake(self._llm, ["weights"])
                compat.sleep(self._llm, 2)
            elif plan.moves_weights or plan.free_kv_cache:
                compat.sleep(self._llm, plan.level)

    def _wake(self, plan: WakePlan) -> None:
        if self.capabilities.sleep_frees_memory:
            if plan.weights_from is not None:
                compat.wake(self._llm, ["weights"])
            if plan.restore_kv_cache:
                compat.wake(self._llm, ["kv_cache"])

    # --- weights -----------------------------------------------------------------------------

    def weight_update(self, version: int) -> AbstractContextManager[WeightLoader]:
        return self._update(version)

    @contextmanager
    def _update(self, version: int) -> Iterator[WeightLoader]:
        try:
            with self._lifecycle.weight_update(version, self._copy) as load:
                yield load
                self._flush_pending()
        finally:
            self._pending.clear()

    def _copy(self, batch: list[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in batch:
            # a copy in the engine's dtype: the caller may reuse its buffer after this call
            dtype = self._lifecycle.specs[name].dtype
            self._pending[name] = tensor.detach().to("cpu", dtype, copy=True)
        complete = [
            group
            for group in {self._group_of[name] for name, _ in batch}
            if all(name in self._pending for name in self._members(group))
        ]
        self._reload([name for group in complete for name in self._members(group)])

    def _members(self, group: str) -> list[str]:
        return [name for name, owner in self._group_of.items() if owner == group]

    def _flush_pending(self) -> None:
        """Complete every partly loaded module with the engine's current values, then load it."""
        if not self._pending:
            return
        current = self._read_hf_weights()
        names = []
        for group in sorted({self._group_of[name] for name in self._pending}):
            for name in self._members(group):
                self._pending.setdefault(name, current[name])
                names.append(name)
        self._reload(names)

    def _reload(self, names: list[str]) -> None:
        if not names:
            return
        weights = [(name, self._pending.pop(name)) for name in names]
        token = compat.hand_off(weights)
        compat.collective_rpc(self._llm, compat.reload_from_handoff, token)

    def weights_digest(self) -> dict[str, str]:
        self._lifecycle.check_weights_resident("read the weights digest")
        self._flush_pending()
        weights = self._read_hf_weights()
        tensors = list(weights.values())
        return format_digests(list(weights), tensors, digest_sums_many(tensors))

    def read_weights(self) -> dict[str, torch.Tensor]:
        """Every weight in Hugging Face names, read back from vLLM's worker (TP shards gathered,
        fused modules split, CPU-repacked linear weights read through their kernel).
        Collective over the TP group."""
        self._lifecycle.check_weights_resident("read the weights")
        return self._read_hf_weights()

    def _read_hf_weights(self) -> dict[str, torch.Tensor]:
        [local] = compat.collective_rpc(self._llm, compat.read_local_parameters)
        weights: dict[str, torch.Tensor] = {}
        for param in self._params:
            weights.update(self._to_hf(param, local[param.vllm_name]))
        return weights

    def _to_hf(self, param: VLLMParam, shard: torch.Tensor) -> dict[str, torch.Tensor]:
        if param.local_sizes:
            pieces = torch.split(shard, list(param.local_sizes), dim=0)
            full = {}
            for index, (name, piece) in enumerate(zip(param.hf_names, pieces, strict=True)):
                shards = self._gather(piece)
                if param.kind == "QKVParallelLinear" and index > 0 and param.kv_replicas > 1:
                    shards = shards[:: param.kv_replicas]  # replicated KV heads: keep one copy
                full[name] = torch.cat(shards, dim=0)
            return full
        [name] = param.hf_names
        if param.kind in ("ColumnParallelLinear", "VocabParallelEmbedding", "ParallelLMHead"):
            tensor = torch.cat(self._gather(shard), dim=0)
            if param.org_vocab_size is not None:
                tensor = tensor[: param.org_vocab_size]
            return {name: tensor.contiguous()}
        if param.kind == "RowParallelLinear" and param.vllm_name.endswith(".weight"):
            return {name: torch.cat(self._gather(shard), dim=1)}
        return {name: shard}

    def _gather(self, shard: torch.Tensor) -> list[torch.Tensor]:
        if self._tp_group is None or dist.get_world_size(self._tp_group) == 1:
            return [shard]
        local = shard.contiguous().to(self._device)
        shards = [torch.empty_like(local) for _ in range(dist.get_world_size(self._tp_group))]
        dist.all_gather(shards, local, group=self._tp_group)
        return [s.cpu() for s in shards]

    # --- teardown ----------------------------------------------------------------------------

    def _release(self) -> None:
        self._pending.clear()
        compat.shutdown_llm(self._llm)
        self._llm = None


def _results(
    requests: Sequence[GenerationRequest], params: SamplingParams, completions: Sequence[Any]
) -> list[GenerationResult]:
    results = []
    for index, completion in enumerate(completions):
        request = requests[index // params.n]
        tokens = tuple(completion.token_ids)
        logprobs = None
        if params.return_logprobs:
            logprobs = tuple(
                step[token].logprob for token, step in zip(tokens, completion.logprobs, strict=True)
            )
        results.append(
            GenerationResult(
                request_id=request.request_id,
                sample_index=index % params.n,
                prompt_token_ids=request.prompt_token_ids,
                output_token_ids=tokens,
                finish_reason=_finish_reason(completion.finish_reason),
                logprobs=logprobs,
            )
        )
    return results


def _finish_reason(reason: str | None) -> FinishReason:
    return "stop" if reason == "stop" else "length"


def _refuse_media_models(model_dir: Path) -> None:
    """A model with a vision or audio tower is refused before vLLM starts: this adapter passes
    no media (``multi_modal_data``) yet, so it declares neither ``images`` nor ``audio``, and
    vllm-cpu 0.32 cannot load a Qwen2-VL model without torchvision (its ``qwen2_vl.py`` imports
    ``smart_resize`` from transformers' torchvision image processor while vLLM inspects the
    architecture; docs/multimodal.md)."""
    config_file = model_dir / "config.json"
    if not config_file.is_file():
        return  # vLLM reports a missing or broken folder itself
    settings = json.loads(config_file.read_text(encoding="utf-8"))
    for key, modality in (("vision_config", "images"), ("audio_config", "audio")):
        if key in settings:
            raise CapabilityNotSupported(
                "vllm",
                modality,
                f"{model_dir} is a {settings.get('model_type', 'multimodal')!r} model with "
                f"{'an audio' if modality == 'audio' else 'a vision'} tower; the vllm engine "
                "takes text prompts only",
            )
