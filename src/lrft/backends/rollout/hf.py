"""``hf`` rollout engine: a transformers causal LM in this process, the embedded default.

Two decoding paths, chosen by ``HFEngineConfig.decode``, both with at most ``max_batch_size``
sequences decoded together, left-padded:

- ``generate``: transformers' ``generate`` in chunks, with a ``GenerationConfig`` built from
  lrft's ``SamplingParams`` alone: the model's own generation defaults (a checkpoint's
  ``generation_config.json``: EOS, top-k, repetition penalty, ...) are replaced by a neutral
  config when the engine takes the model, because transformers fills every unset field from them.
- ``static`` / ``cuda_graph`` / ``compiled``: the static-cache loop of ``_hf_decode`` (sampling
  on the device, no per-token host synchronisation, a finished row refilled with the next
  waiting sequence); ``cuda_graph`` replays each step from a CUDA graph, ``compiled`` compiles
  the step with ``torch.compile`` first (the CUDA default).

Memory: the weights are views into one flat device buffer (``_weight_moves.FlatWeights``), so
``weights_digest`` reads them in place and parking moves them in one copy. ``generate``'s KV
cache exists only inside a call; the static loop keeps its cache and graphs between calls.
Sleeping frees both (the static cache and graphs are dropped, and the allocator's cached blocks
returned); the next call allocates and captures again, on the weights where waking put them.
Level 1 parks the weight buffer in host memory (pinned on CUDA) and level 2 frees it; on a CPU
device level 1 has nothing to move. TP 1 only.

Media: a vision- or audio-language model (a config with a vision or audio tower) makes the engine
declare ``images`` or ``audio``. It takes requests' processed media (``ProcessedMedia``: the
model processor's tensors, the expanded prompt ids), never raw images: on the ``generate`` path
as the model's own keyword arguments, in the static loop into each prefill, with an m-RoPE
model's 3-D positions (``lrft.models.media``) and, per row, the delta its decode steps add to
their positions; a row refilled mid-call brings its own.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol, cast

import attrs
import torch

from lrft.api import validators as v
from lrft.api.capabilities import EngineCapabilities
from lrft.api.digest import format_digests
from lrft.api.errors import ConfigError
from lrft.api.media import ProcessedMedia
from lrft.api.protocols import WeightLoader
from lrft.api.types import (
    FinishReason,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    TensorSpec,
    WeightsResidency,
)
from lrft.backends import registry
from lrft.backends.rollout._engine_base import EngineAdapter, caller_rng_kept, default_device
from lrft.backends.rollout._hf_decode import (
    PAD_ID,
    StaticDecoder,
    static_decode_unsupported,
)
from lrft.backends.rollout._hf_generation import (
    chosen_logprobs,
    completions,
    decoded,
    generation_config,
    new_generation_config,
    processed_media,
)
from lrft.backends.rollout._lifecycle import EngineLifecycle, SleepPlan, WakePlan
from lrft.backends.rollout._weight_moves import FlatWeights
from lrft.models.media import (
    MediaBatch,
    load_generative_model,
    media_modalities,
    placeholder_token_ids,
)

DECODE_PATHS = registry.declared_engine_facts()["hf"].decode_paths


def _optional_device(value: str | torch.device | None) -> torch.device | None:
    return None if value is None else torch.device(value)


@attrs.frozen(kw_only=True)
class HFEngineConfig:
    """Settings of the ``hf`` engine.

    dtype: the dtype the engine stores and computes in; ``None`` keeps the checkpoint's (from a
        folder) or the module's own. Loaded weights are cast to it.
    device: where the model lives; ``None`` is the current CUDA device when there is one, else
        the CPU.
    max_batch_size: sequences (requests x n) decoded together; bounds activation and KV-cache
        memory (and, on the ``generate`` path, the raw logits kept for logprobs:
        ``steps x max_batch_size x vocab``). Decoding is bound by reading the weights once per
        step, so one large chunk is faster than several small ones.
    decode: the decoding path. ``generate``: transformers' ``generate``. ``static``: the
        static-cache loop (no per-token host synchronisation). ``cuda_graph``: the static loop
        with every step replayed from a CUDA graph (CUDA devices only). ``compiled``: the static
        loop with its step compiled by ``torch.compile`` (the first call compiles: about 50 s
        for a 0.4 B model on an H200), replayed from CUDA graphs on a CUDA device. ``auto``:
        ``cuda_graph`` on a CUDA device when the model supports a static cache, else
        ``generate``.
    """

    dtype: torch.dtype | None = None
    device: torch.device | None = attrs.field(default=None, converter=_optional_device)
    max_batch_size: int = attrs.field(default=32, validator=v.positive_number)
    decode: str = attrs.field(default="auto", validator=v.one_of(*DECODE_PATHS))


class _CausalLM(Protocol):
    """The part of a transformers ``GenerationMixin`` model the engine calls."""

    def generate(
        self,
        *,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        generation_config: Any,
        **media: torch.Tensor,
    ) -> Any: ...


class HFRolloutEngine(EngineAdapter):
    """A ``RolloutEngine`` (structurally) on a transformers causal LM; see ``lrft.api``.

    The engine takes ownership of ``model``: it moves and casts it, replaces its generation
    config, copies its parameters into one flat buffer (each Parameter's data becomes a view of
    it, so the model's own storage is freed) and frees or replaces that buffer when sleeping.
    ``weights_version`` starts at 0 (the weights it was built with).
    """

    def __init__(self, model: torch.nn.Module, *, config: HFEngineConfig | None = None) -> None:
        self.config = config if config is not None else HFEngineConfig()
        if not callable(getattr(model, "generate", None)):
            raise TypeError(
                f"the hf engine needs a transformers causal LM with generate(), got "
                f"{type(model).__name__}"
            )
        self._device = self.config.device if self.config.device is not None else default_device()
        torch.nn.Module.to(model, device=self._device, dtype=self.config.dtype)
        torch.nn.Module.eval(model)
        model.requires_grad_(False)
        # A plain setattr: nn.Module's typed __setattr__ only admits tensors and modules.
        setattr(model, "generation_config", new_generation_config())  # noqa: B010
        self._model: torch.nn.Module | None = model
        # named_parameters() lists a tied weight once; the other names it has become aliases.
        self._params = dict(model.named_parameters())
        self._weights: FlatWeights | None = FlatWeights(self._params, self._device)
        canonical = {id(p): name for name, p in self._params.items()}
        aliases = {
            name: canonical[id(p)]
            for name, p in model.named_parameters(remove_duplicate=False)
            if name not in self._params
        }
        specs = {
            name: TensorSpec(shape=tuple(p.shape), dtype=p.dtype)
            for name, p in self._params.items()
        }
        modalities = media_modalities(model)
        capabilities = EngineCapabilities(
            sleep_levels={1, 2},
            sleep_frees_memory=self._device.type == "cuda",
            max_tp=1,
            returns_logprobs=True,
            loads_in_place=True,
            images="images" in modalities,
            audio="audio" in modalities,
        )
        self._lifecycle = EngineLifecycle(
            backend=self.name, capabilities=capabilities, specs=specs, aliases=aliases
        )
        self._decoder = self._static_decoder(model)
        self._placeholders = placeholder_token_ids(model)

    def _static_decoder(self, model: torch.nn.Module) -> StaticDecoder | None:
        """The static loop ``config.decode`` asks for (``None``: transformers' ``generate``)."""
        wanted = self.config.decode
        on_cuda = self._device.type == "cuda"
        unsupported = static_decode_unsupported(model)
        if wanted == "auto":
            # cuda_graph, not compiled: since each row decodes at its own column, the compiled
            # step is slower than the replayed eager one (W2 on an H200: 8.84 against 5.62 ms a
            # step, docs/benchmarks.md) and costs a compile of over a minute first
            wanted = "cuda_graph" if on_cuda and unsupported is None else "generate"
        if wanted == "generate":
            return None
        if unsupported is not None:
            raise ConfigError(f"decode={wanted!r} needs a static KV cache, but {unsupported}")
        if wanted == "cuda_graph" and not on_cuda:
            raise ConfigError(f"decode='cuda_graph' needs a CUDA device, got {self._device}")
        return StaticDecoder(
            model,
            self._device,
            cuda_graphs=on_cuda and wanted != "static",
            compile_backend="inductor" if wanted == "compiled" else None,
        )

    @classmethod
    def from_pretrained(
        cls, directory: str | os.PathLike[str], *, config: HFEngineConfig | None = None
    ) -> HFRolloutEngine:
        """An engine serving the Hugging Face model folder ``directory`` (a causal LM, or a
        vision- or audio-language model: it then declares ``images`` or ``audio``)."""
        config = config if config is not None else HFEngineConfig()
        dtype: torch.dtype | str = config.dtype if config.dtype is not None else "auto"
        return cls(load_generative_model(directory, dtype=dtype), config=config)

    # --- description -------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return "hf"

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def decode_path(self) -> str:
        """The decoding path in use: ``generate``, ``static``, ``cuda_graph`` or ``compiled``."""
        if self._decoder is None:
            return "generate"
        if self._decoder.compiled:
            return "compiled"
        return "cuda_graph" if self._decoder.cuda_graphs else "static"

    @property
    def model(self) -> torch.nn.Module:
        """The wrapped transformers model (its parameters hold no data while asleep)."""
        self._lifecycle.check_open()
        assert self._model is not None  # cleared only by shutdown, checked above
        return self._model

    # --- generation --------------------------------------------------------------------------

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        """``params.n`` samples per request, request-major; see ``RolloutEngine.generate``."""
        self._lifecycle.check_can_generate(requests)
        processed = [processed_media(request) for request in requests]
        rows = [(index, sample) for index in range(len(requests)) for sample in range(params.n)]
        prompts = [requests[index].prompt_token_ids for index, _ in rows]
        limits = [requests[index].capped(params).max_new_tokens for index, _ in rows]
        media = [processed[index] for index, _ in rows]
        outputs: list[tuple[list[int], FinishReason, list[float] | None]] = []
        size = self.config.max_batch_size
        with self._seeded(params.seed), torch.inference_mode():
            if self._decoder is None:
                for start in range(0, len(rows), size):
                    chunk = slice(start, start + size)
                    outputs += self._generate_chunk(
                        prompts[chunk], limits[chunk], params, media[chunk]
                    )
            elif rows:
                # One call for every sequence: a row that finishes takes the next waiting one.
                output = self._decoder.decode(
                    prompts, limits, min(size, len(rows)), params, media=media
                )
                outputs = decoded(output, params)
        return [
            GenerationResult(
                request_id=requests[index].request_id,
                sample_index=sample,
                prompt_token_ids=requests[index].prompt_token_ids,
                output_token_ids=tokens,
                finish_reason=reason,
                logprobs=None if logprobs is None else tuple(logprobs),
            )
            for (index, sample), (tokens, reason, logprobs) in zip(rows, outputs, strict=True)
        ]

    def _generate_chunk(
        self,
        prompts: Sequence[tuple[int, ...]],
        limits: Sequence[int],
        params: SamplingParams,
        media: Sequence[ProcessedMedia | None],
    ) -> list[tuple[list[int], FinishReason, list[float] | None]]:
        """transformers' ``generate`` for one chunk, as far as its longest limit; each row is cut
        at its own (the tokens before a cut do not depend on it). The rows' media go in as the
        model's own keyword arguments; transformers places an m-RoPE model's tokens itself."""
        width = max(len(prompt) for prompt in prompts)
        input_ids = torch.full((len(prompts), width), PAD_ID, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[row, width - len(prompt) :] = 1
        longest = max(limits)
        chunk_params = attrs.evolve(
            params, max_new_tokens=longest, min_new_tokens=min(params.min_new_tokens, longest)
        )
        batch = MediaBatch.build(
            media,
            offsets=[width - len(prompt) for prompt in prompts],
            width=width,
            device=self._device,
        )
        model = cast(_CausalLM, self.model)
        output = model.generate(
            input_ids=input_ids.to(self._device),
            attention_mask=attention_mask.to(self._device),
            generation_config=generation_config(chunk_params, self._placeholders),
            **batch.kwargs,
        )
        generated: torch.Tensor = output.sequences[:, width:]
        logprobs = None
        if params.return_logprobs:
            raw_logits: tuple[torch.Tensor, ...] = output.logits
            logprobs = chosen_logprobs(raw_logits, generated, params).tolist()
        tokens = [row[:limit] for row, limit in zip(generated.tolist(), limits, strict=True)]
        return completions(tokens, logprobs, params)

    @contextmanager
    def _seeded(self, seed: int | None) -> Iterator[None]:
        """Seed the generators sampling uses, and restore them afterwards: the caller's RNG
        streams are untouched, so seeding a rollout never changes the training's randomness."""
        if seed is None:
            yield
            return
        with caller_rng_kept(self._device):
            torch.default_generator.manual_seed(seed)
            if self._device.type == "cuda":
                # Only this engine's device: torch.manual_seed would reseed every GPU's generator.
                with torch.cuda.device(self._device):
                    torch.cuda.manual_seed(seed)
            yield

    # --- memory ------------------------------------------------------------------------------

    @property
    def _flat(self) -> FlatWeights:
        assert self._weights is not None  # cleared only by shutdown, which the lifecycle refuses
        return self._weights

    def _sleep(self, plan: SleepPlan) -> None:
        if self._decoder is not None:
            self._decoder.release()
        if plan.weights_to is WeightsResidency.RELEASED and plan.moves_weights:
            self._flat.release()
        elif (
            plan.weights_to is WeightsResidency.PARKED
            and plan.moves_weights
            # on a CPU device the weights already are in host memory: nothing to park
            and self._device.type != "cpu"
        ):
            self._flat.park()
        self._empty_device_cache()

    def _wake(self, plan: WakePlan) -> None:
        if plan.weights_from is WeightsResidency.PARKED and self._flat.parked:
            self._flat.restore()
        elif plan.weights_from is WeightsResidency.RELEASED:
            self._flat.allocate()
        # The KV cache needs nothing here: the next generate allocates it (and captures the
        # static loop's graphs again, on the weights' new addresses).

    def _empty_device_cache(self) -> None:
        if self._device.type == "cuda":
            # cuBLAS keeps a workspace for every stream it ran on (the decode graphs' capture
            # stream among them) in the caching allocator, about 100 MiB on an H200 with
            # torch 2.11, which empty_cache cannot return while they are held. Cleared, they
            # are made again on next use; the graphs that used them were released above.
            torch._C._cuda_clearCublasWorkspaces()
            torch.cuda.empty_cache()

    # --- weights -----------------------------------------------------------------------------

    def weight_update(self, version: int) -> AbstractContextManager[WeightLoader]:
        # The flat buffer is the storage the model serves from: a sync may write into it.
        return self._lifecycle.weight_update(version, self._copy, store=self._flat)

    def _copy(self, batch: list[tuple[str, torch.Tensor]]) -> None:
        if not batch:
            return
        with torch.no_grad():
            # One fused copy for the batch (it casts to the engine's dtype and device); torch
            # falls back to one copy per tensor where dtypes or devices are mixed.
            torch._foreach_copy_([self._params[name] for name, _ in batch], [t for _, t in batch])

    def weights_digest(self) -> dict[str, str]:
        self._lifecycle.check_weights_resident("read the weights digest")
        # One reduction over the weight buffer in place, in the order of self._params.
        return format_digests(list(self._params), list(self._params.values()), self._flat.sums())

    # --- teardown ----------------------------------------------------------------------------

    def _release(self) -> None:
        if self._decoder is not None:
            self._decoder.release()
            self._decoder = None
        self._params.clear()
        self._weights = None
        self._model = None
        self._empty_device_cache()
