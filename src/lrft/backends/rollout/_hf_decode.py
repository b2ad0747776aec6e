"""Static-cache decoding for the ``hf`` engine: the fast path, and on CUDA its CUDA graph.

transformers' ``generate`` synchronises with the host at every token (stopping criteria, the
growing attention mask, logits kept per step) and grows its KV cache by concatenation, so a small
model spends most of a rollout launching kernels. This loop drives the same transformers model
with shapes that never change after the prefill:

- a transformers ``StaticCache`` of ``rows x cache_length`` (the length rounded up to
  ``_LENGTH_BUCKET``, so calls whose prompts differ a little share one cache);
- a 4D additive attention mask built on the device from the step counter, which transformers
  passes through as it is (a 2D mask would make it check for padding on the host);
- sampling on the device: temperature, min-new-tokens suppression of stop ids, top-k and top-p
  with the semantics of transformers' logits warpers, then one categorical draw by the
  exponential race (``argmax(p / E)``, ``E ~ Exp(1)``), which needs no host round trip;
- a fixed number of steps; rows that stopped keep running on padding, and the host checks
  whether all rows stopped only every ``check_every`` steps (never when no stop ids are set).

One decode step (forward, sampling, bookkeeping) is a function of buffers at fixed addresses, so
on CUDA it is captured once into a CUDA graph and replayed for every later token; its forward may
first be compiled by ``torch.compile``, which fuses the many small kernels of a decode step. The
graph reads the weights where they are: loads that copy into the parameters in place are seen by
the next replay; anything that moves them (sleep, wake) drops the graphs (``release``), and the
next call captures again. Sampling uses the device's default generator, whose seed and offset a graph
replay reads at replay time, so seeding around a call works as it does for eager code.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

import attrs
import torch

from lrft.api.types import SamplingParams
from lrft.backends.rollout._hf_attention import GQA_SDPA, use_gqa_sdpa

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE

# Cache lengths are rounded up to a multiple of this, so that prompts of slightly different
# lengths reuse one static cache and its captured graphs.
_LENGTH_BUCKET = 64
# A decode step attends to the cache's columns up to the next multiple of this past its own,
# not to the whole cache: one graph per such width (a 1152-column cache has 9).
LIVE_BUCKET = 128
# Left padding and the steps of rows that already stopped hold this id; both are masked or cut
# off, so any id in the vocabulary does.
PAD_ID = 0


def static_decode_unsupported(model: torch.nn.Module) -> str | None:
    """Why ``model`` cannot run the static loop, or ``None`` when it can."""
    config = getattr(model, "config", None)
    if config is None or not callable(getattr(model, "get_output_embeddings", None)):
        return f"{type(model).__name__} is not a transformers causal LM"
    if not getattr(model, "_can_compile_fullgraph", False):
        return f"{type(model).__name__} does not support a static KV cache in transformers"
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"}:
        return f"its layers are {sorted(layer_types)}; the static loop masks full attention only"
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in ("sdpa", "eager", GQA_SDPA):
        return f"attention implementation {implementation!r} takes no 4D additive mask"
    return None


@attrs.frozen(kw_only=True)
class DecodeOutput:
    """Generated ids and (when asked) their logprobs, ``(rows, steps)`` on the host; ``steps``
    is shorter than ``max_new_tokens`` only when every row stopped early."""

    tokens: torch.Tensor
    logprobs: torch.Tensor | None


@attrs.frozen
class _Mode:
    """What a captured step computes; everything else it reads from buffers."""

    greedy: bool
    truncate: bool
    logprobs: bool


class _Slot:
    """The fixed-address memory of one ``(rows, cache_length)`` shape: the static KV cache, the
    step's inputs and outputs, the sampling settings, and the graphs captured on them."""

    def __init__(
        self, model: torch.nn.Module, rows: int, length: int, vocab: int, device: torch.device
    ) -> None:
        from transformers import PreTrainedConfig, StaticCache

        self.rows, self.length = rows, length
        config = cast(PreTrainedConfig, model.config)
        self.cache = StaticCache(config=config, max_cache_len=length)
        self.columns = torch.arange(length, device=device)
        self.keep = torch.ones((rows, length), dtype=torch.bool, device=device)
        self.next_input = torch.full((rows, 1), PAD_ID, dtype=torch.long, device=device)
        self.positions = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self.write_position = torch.zeros((), dtype=torch.long, device=device)
        self.step = torch.zeros((), dtype=torch.long, device=device)
        self.done = torch.zeros(rows, dtype=torch.bool, device=device)
        self.tokens = torch.full((rows, length), PAD_ID, dtype=torch.long, device=device)
        self.logprobs = torch.zeros((rows, length), dtype=torch.float32, device=device)
        self.temperature = torch.ones((), dtype=torch.float32, device=device)
        self.top_p = torch.ones((), dtype=torch.float32, device=device)
        self.top_k_index = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self.min_new_tokens = torch.zeros((), dtype=torch.long, device=device)
        self.stop_columns = torch.zeros(vocab, dtype=torch.bool, device=device)
        # One graph per mode and attended width; they share one memory pool, as they never run
        # at once and each leaves its results in the buffers above, not in the pool.
        self.graphs: dict[tuple[_Mode, int], torch.cuda.CUDAGraph] = {}
        self.pool: _POOL_HANDLE | None = None
        self.weight_pointers: tuple[int, ...] = ()

    def drop_graphs(self) -> None:
        self.graphs.clear()
        self.pool = None

    def reset_cache(self) -> None:
        """Empty the cache in place (its tensors keep their addresses)."""
        self.cache.reset()  # type: ignore[no-untyped-call]  # unannotated in transformers

    def set_sampling(self, params: SamplingParams, vocab: int) -> None:
        self.temperature.fill_(1.0 if params.greedy else params.temperature)
        self.top_p.fill_(params.top_p)
        # top-k keeps the k largest scores: their threshold is entry vocab-k of the ascending
        # sort (k = 0 disables it: entry 0, the smallest, removes nothing).
        k = min(params.top_k, vocab)
        self.top_k_index.fill_(vocab - k if k > 0 else 0)
        self.min_new_tokens.fill_(params.min_new_tokens)
        self.stop_columns.zero_()
        stops = [token for token in params.stop_token_ids if token < vocab]
        if stops:
            self.stop_columns[torch.tensor(stops, device=self.stop_columns.device)] = True


class StaticDecoder:
    """Decodes chunks of prompts for the ``hf`` engine with a static cache (see module doc).

    ``cuda_graphs`` replays each step from a captured CUDA graph (CUDA devices only).
    ``compile_backend`` names a ``torch.compile`` backend for the decode step's forward (``None``:
    eager); the compiled code is captured into the graphs like eager code.
    ``check_every`` is how many steps run between host checks of whether all rows stopped.

    A compiled step is compiled again when one of torch's guards fails: for another shape (after
    which it is compiled for dynamic shapes) or for another engine's model; moving the weights
    (sleep, wake) changes no guard. torch stops compiling after
    ``torch._dynamo.config.recompile_limit`` compiles of one code object and runs it eagerly, so
    a process should not build many compiled engines.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device,
        *,
        cuda_graphs: bool,
        compile_backend: str | None = None,
        check_every: int = 8,
    ) -> None:
        if cuda_graphs and device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {device}")
        self._model = model
        self._device = device
        self._cuda_graphs = cuda_graphs
        self._check_every = check_every
        output_weight = model.get_output_embeddings().weight  # type: ignore[operator]  # a transformers model, typed as a plain Module
        self._vocab = int(output_weight.shape[0])
        self._dtype: torch.dtype = output_weight.dtype
        # transformers 5.24 renamed the forward's ``past_key_values`` to ``cache`` (the old name
        # still works, with a deprecation warning at every call).
        forward_parameters = inspect.signature(model.forward).parameters
        self._cache_keyword = "cache" if "cache" in forward_parameters else "past_key_values"
        self._compiled = compile_backend is not None
        self._decode_forward: Callable[..., torch.Tensor] = self._forward_one
        if compile_backend is not None:
            self._decode_forward = torch.compile(self._forward_one, backend=compile_backend)
        use_gqa_sdpa(model)
        # Only lrft's own attention takes masks narrower than the cache (transformers' eager
        # attention adds the mask to scores over every cached column).
        self._narrow_masks = getattr(model.config, "_attn_implementation", None) == GQA_SDPA
        self._slot: _Slot | None = None
        # One side stream for every warm-up and capture: cuBLAS keeps a workspace per stream,
        # so a fresh stream per capture would leave a workspace behind each time.
        self._capture_stream: torch.cuda.Stream | None = None

    # --- public ----------------------------------------------------------------------------

    @property
    def cuda_graphs(self) -> bool:
        return self._cuda_graphs

    @property
    def compiled(self) -> bool:
        return self._compiled

    def release(self) -> None:
        """Free the static cache and every captured graph (their memory goes back to the
        allocator); the next ``decode`` allocates and captures again."""
        if self._slot is not None and self._device.type == "cuda":
            torch.cuda.synchronize(self._device)
        self._slot = None

    def decode(
        self, prompts: Sequence[tuple[int, ...]], rows: int, params: SamplingParams
    ) -> DecodeOutput:
        """Generate for ``prompts`` in one batch of ``rows`` (>= len(prompts)); the extra rows
        repeat the first prompt, so that chunks of one call share a shape, and are dropped."""
        assert 0 < len(prompts) <= rows, (len(prompts), rows)
        padded = list(prompts) + [prompts[0]] * (rows - len(prompts))
        width = max(len(prompt) for prompt in padded)
        steps = params.max_new_tokens
        length = -(-(width + steps) // _LENGTH_BUCKET) * _LENGTH_BUCKET
        slot = self._slot_for(rows, length)
        slot.set_sampling(params, self._vocab)
        mode = _Mode(
            greedy=params.greedy,
            truncate=not params.greedy and (params.top_k > 0 or params.top_p < 1.0),
            logprobs=params.return_logprobs,
        )
        # Step s attends to the prompt and the s tokens before its own, rounded up.
        attended = [self._attended(width + step, length) for step in range(1, steps)]
        graphs = {}
        if self._cuda_graphs:
            # Captured before the prefill: a capture runs the step, which would disturb a decode.
            graphs = {columns: self._graph_for(slot, mode, columns) for columns in set(attended)}
        self._prefill(slot, padded, width, mode)
        check = bool(params.stop_token_ids)
        done_steps = steps
        for step, columns in enumerate(attended, start=1):
            graph = graphs.get(columns)
            if graph is not None:
                graph.replay()
            else:
                self._step(slot, mode, columns)
            if check and (step + 1) % self._check_every == 0 and bool(slot.done.all()):
                done_steps = step + 1
                break
        real = len(prompts)
        # Copies even on a CPU device: the slot's buffers are overwritten by the next call.
        tokens = slot.tokens[:real, :done_steps].to("cpu", copy=True)
        logprobs = None
        if mode.logprobs:
            logprobs = slot.logprobs[:real, :done_steps].to("cpu", copy=True)
        return DecodeOutput(tokens=tokens, logprobs=logprobs)

    def _attended(self, live: int, length: int) -> int:
        """The columns a step with ``live`` cache columns in use attends to."""
        if not self._narrow_masks:
            return length
        return min(length, -(-live // LIVE_BUCKET) * LIVE_BUCKET)

    # --- memory ----------------------------------------------------------------------------

    def _slot_for(self, rows: int, length: int) -> _Slot:
        slot = self._slot
        pointers = tuple(p.data_ptr() for p in self._model.parameters())
        if slot is not None and (slot.rows, slot.length) == (rows, length):
            if slot.weight_pointers != pointers:
                # The weights moved since the graphs were captured: their addresses are stale.
                slot.drop_graphs()
                slot.weight_pointers = pointers
            return slot
        self.release()  # one slot at a time: free the old cache before allocating the new one
        slot = self._slot = _Slot(self._model, rows, length, self._vocab, self._device)
        slot.weight_pointers = pointers
        return slot

    def _graph_for(self, slot: _Slot, mode: _Mode, columns: int) -> torch.cuda.CUDAGraph:
        graph = slot.graphs.get((mode, columns))
        if graph is not None:
            return graph
        # Capture runs the step on placeholder inputs; the caller's RNG stream and the slot's
        # contents are put back afterwards (the prefill resets the cache and every counter).
        slot.keep.fill_(True)
        with torch.random.fork_rng(devices=[self._device]), torch.cuda.device(self._device):
            # Warm-ups on the current stream, which allocates the lazily built cache there, and
            # on a side stream, as PyTorch asks before a capture.
            self._reset_counters(slot)
            self._step(slot, mode, columns)
            if self._capture_stream is None:
                self._capture_stream = torch.cuda.Stream(self._device)  # type: ignore[no-untyped-call]  # unannotated in torch
            side = self._capture_stream
            side.wait_stream(torch.cuda.current_stream(self._device))
            with torch.cuda.stream(side):
                self._reset_counters(slot)
                self._step(slot, mode, columns)
            torch.cuda.current_stream(self._device).wait_stream(side)
            self._reset_counters(slot)
            graph = torch.cuda.CUDAGraph()
            if slot.pool is None:
                slot.pool = torch.cuda.graph_pool_handle()
            with torch.cuda.graph(graph, pool=slot.pool, stream=side):
                self._step(slot, mode, columns)
        slot.graphs[(mode, columns)] = graph
        return graph

    @staticmethod
    def _reset_counters(slot: _Slot) -> None:
        slot.reset_cache()
        slot.write_position.zero_()
        slot.step.zero_()
        slot.positions.zero_()
        slot.done.zero_()

    # --- the loop --------------------------------------------------------------------------

    def _prefill(
        self, slot: _Slot, prompts: Sequence[tuple[int, ...]], width: int, mode: _Mode
    ) -> None:
        """One forward over the left-padded prompts, then the first token (step 0)."""
        rows, device = slot.rows, self._device
        input_ids = torch.full((rows, width), PAD_ID, dtype=torch.long)
        present = torch.zeros((rows, width), dtype=torch.bool)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            present[row, width - len(prompt) :] = True
        input_ids, present = input_ids.to(device), present.to(device)
        positions = (present.long().cumsum(-1) - 1).clamp_min(0)
        # A padding slot attends to itself only, so that no row of the mask is empty (an empty
        # row gives NaN in some SDPA kernels, and NaN values poison later masked products).
        query = slot.columns[:width, None]
        keys = slot.columns[None, :]
        own = keys == query
        visible = (keys <= query) & (own | _pad_columns(present, slot.length)[:, None, :])
        if self._narrow_masks:
            visible = visible[:, :, :width]  # the prompts attend to their own columns only
        slot.reset_cache()
        logits = self._model(
            input_ids=input_ids,
            attention_mask=self._additive(visible[:, None]),
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_keyword: slot.cache},
        ).logits
        slot.keep.copy_(_pad_columns(present, slot.length))
        slot.positions.copy_(present.sum(-1, keepdim=True))
        slot.write_position.fill_(width)
        slot.step.zero_()
        slot.done.zero_()
        self._sample(slot, logits[:, -1], mode)

    def _step(self, slot: _Slot, mode: _Mode, columns: int) -> None:
        """One decode step attending to the cache's first ``columns`` columns (all of them for
        attention that takes only a mask as wide as the cache)."""
        keep = slot.keep[:, :columns] if self._narrow_masks else slot.keep
        # One compiled step for every width, rather than one compile per width.
        torch._dynamo.maybe_mark_dynamic(keep, 1)
        logits = self._decode_forward(
            slot.cache, slot.next_input, slot.positions, keep, slot.write_position
        )
        slot.positions.add_(1)
        slot.write_position.add_(1)
        self._sample(slot, logits, mode)

    def _forward_one(
        self,
        cache: object,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        keep: torch.Tensor,
        write_position: torch.Tensor,
    ) -> torch.Tensor:
        """Logits ``(rows, vocab)`` of one new token per row, written at ``write_position``."""
        columns = torch.arange(keep.shape[1], device=keep.device)
        visible = keep & (columns <= write_position)
        logits: torch.Tensor = self._model(
            input_ids=input_ids,
            attention_mask=self._additive(visible[:, None, None, :]),
            position_ids=positions,
            use_cache=True,
            **{self._cache_keyword: cache},
        ).logits
        return logits[:, -1]

    def _additive(self, visible: torch.Tensor) -> torch.Tensor:
        """The additive mask transformers passes to SDPA or eager attention as it is."""
        zero = torch.zeros((), dtype=self._dtype, device=visible.device)
        return torch.where(visible, zero, torch.finfo(self._dtype).min)

    def _sample(self, slot: _Slot, logits: torch.Tensor, mode: _Mode) -> None:
        """Choose step ``slot.step``'s token of every row, record it, and advance."""
        raw = logits.float()
        scores = raw if mode.greedy else raw / slot.temperature
        suppressed = slot.stop_columns & (slot.step < slot.min_new_tokens)
        filtered = scores.masked_fill(suppressed, float("-inf"))
        if mode.greedy:
            token = filtered.argmax(-1)
        else:
            if mode.truncate:
                filtered = _top_k_top_p(filtered, slot.top_k_index, slot.top_p)
            probabilities = filtered.softmax(-1)
            race = torch.empty_like(probabilities).exponential_()
            # Exp(1) draws of exactly 0 would turn a removed token's 0 / 0 into NaN, which
            # argmax prefers.
            race.clamp_min_(torch.finfo(race.dtype).tiny)
            token = (probabilities / race).argmax(-1)
        token = torch.where(slot.done, PAD_ID, token)
        column = slot.step.view(1)
        slot.tokens.index_copy_(1, column, token[:, None])
        if mode.logprobs:
            # The contract's logprob: log_softmax(logits / T) before suppression or truncation.
            chosen = scores.log_softmax(-1).gather(1, token[:, None])
            slot.logprobs.index_copy_(1, column, chosen)
        slot.done.logical_or_(slot.stop_columns[token])
        slot.next_input.copy_(token[:, None])
        slot.step.add_(1)


def _pad_columns(present: torch.Tensor, length: int) -> torch.Tensor:
    """``present`` (rows, width) widened to ``length`` columns: generated columns are present."""
    rows, width = present.shape
    tail = torch.ones((rows, length - width), dtype=torch.bool, device=present.device)
    return torch.cat([present, tail], dim=1)


def _top_k_top_p(
    scores: torch.Tensor, top_k_index: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """transformers' ``TopKLogitsWarper`` then ``TopPLogitsWarper`` (removed scores are -inf),
    on one ascending sort, with k and p read from device tensors."""
    ordered, order = scores.sort(dim=-1)
    threshold = ordered.gather(1, top_k_index)
    ordered = ordered.masked_fill(ordered < threshold, float("-inf"))
    cumulative = ordered.softmax(-1).cumsum(-1)
    removed = cumulative <= 1 - top_p
    removed[:, -1] = False  # the most likely token always stays
    ordered = ordered.masked_fill(removed, float("-inf"))
    return torch.empty_like(scores).scatter_(1, order, ordered)
