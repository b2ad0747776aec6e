"""Static-cache decoding for the ``hf`` engine: the fast path, and on CUDA its CUDA graphs.

transformers' ``generate`` synchronises with the host at every token (stopping criteria, the
growing attention mask, logits kept per step) and grows its KV cache by concatenation, so a small
model spends most of a rollout launching kernels. This loop drives the same transformers model
with shapes that change only between a few sizes:

- lrft's ``RowCache`` (``_hf_cache``) of ``rows x cache_length`` (the length rounded up to
  ``_LENGTH_BUCKET``, so calls whose prompts differ a little share one cache), in which every
  row has its own column: a row that finished takes the next waiting sequence (a prefill of that
  row alone, or of the group refilled together) while the others keep decoding;
- per row, its first column (the left padding of its prefill), the column it writes next and its
  token budget, on the device: a 4D additive mask built from them, which transformers passes
  through as it is (a 2D mask would make it check for padding on the host);
- sampling on the device: temperature, min-new-tokens suppression of stop ids, top-k and top-p
  with the semantics of transformers' logits warpers, then one categorical draw by the
  exponential race (``argmax(p / E)``, ``E ~ Exp(1)``), which needs no host round trip;
- the host plans rows, refills and the rows a step runs over (``_hf_rows``) from what it knows
  without reading the device (when each row started, its width and budget); it reads the rows'
  stop flags only every ``check_every`` steps, and only when stop ids are set. Once nothing
  waits, the live rows are moved to the front and steps run over the smallest bucket of rows
  that holds them.

One decode step (forward, sampling, bookkeeping) is a function of buffers at fixed addresses, so
on CUDA it is captured into a CUDA graph per (rows, attended width) and replayed for every later
token; its forward may first be compiled by ``torch.compile``, which fuses the many small kernels
of a decode step. A graph is captured when a step first needs it, even in the middle of a call:
the capture's runs write only the columns and outputs the next real step overwrites, and the
rows' counters are put back afterwards. The graphs read the weights where they are: loads that
copy into the parameters in place are seen by the next replay; anything that moves them (sleep,
wake) drops the graphs (``release``), and the next call captures again. Sampling uses the
device's default generator, whose seed and offset a graph replay reads at replay time, so seeding
around a call works as it does for eager code.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import torch

from lrft.api.media import ProcessedMedia
from lrft.api.types import SamplingParams
from lrft.backends.rollout._hf_attention import GQA_SDPA, use_gqa_sdpa
from lrft.backends.rollout._hf_cache import RowCache
from lrft.backends.rollout._hf_rows import Move, RowPlan
from lrft.backends.rollout._hf_sampling import Mode, choose
from lrft.backends.rollout._hf_slot import PAD_ID, DecodeOutput, Outputs, Rows, Slot
from lrft.models.media import MediaBatch, placeholder_token_ids, rope_positions

__all__ = ["LIVE_BUCKET", "PAD_ID", "DecodeOutput", "StaticDecoder", "static_decode_unsupported"]

# Cache lengths are rounded up to a multiple of this, so that prompts of slightly different
# lengths reuse one cache and its captured graphs.
_LENGTH_BUCKET = 64
# A decode step attends to the cache's columns up to the next multiple of this past the last one
# a live row writes, not to the whole cache: one graph per such width (a 1152-column cache has 9).
LIVE_BUCKET = 128


def static_decode_unsupported(model: torch.nn.Module) -> str | None:
    """Why ``model`` cannot run the static loop, or ``None`` when it can."""
    config = getattr(model, "config", None)
    if config is None or not callable(getattr(model, "get_output_embeddings", None)):
        return f"{type(model).__name__} is not a transformers causal LM"
    if not getattr(model, "_can_compile_fullgraph", False) and not _text_model_supports(model):
        return f"{type(model).__name__} does not support a static KV cache in transformers"
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"}:
        return f"its layers are {sorted(layer_types)}; the static loop masks full attention only"
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in ("sdpa", "eager", GQA_SDPA):
        return f"attention implementation {implementation!r} takes no 4D additive mask"
    return None


def _text_model_supports(model: torch.nn.Module) -> bool:
    """Whether the language model inside a media model supports a static KV cache.

    transformers 5.24 leaves Qwen2-Audio unflagged because merging its audio features is
    data-dependent (``masked_scatter`` over a counted number of placeholders); the static loop
    runs that merge in its eager prefill only, and its decode steps (one text token per row, no
    media inputs) reach the language model alone, which is a flagged Qwen2."""
    inner = getattr(model, "model", None)
    text = getattr(inner, "language_model", None)
    return isinstance(text, torch.nn.Module) and bool(
        getattr(text, "_can_compile_fullgraph", False)
    )


class StaticDecoder:
    """Decodes a call's sequences for the ``hf`` engine with a per-row cache (see module doc).

    ``cuda_graphs`` replays each step from a captured CUDA graph (CUDA devices only).
    ``compile_backend`` names a ``torch.compile`` backend for the decode step's forward (``None``:
    eager); the compiled code is captured into the graphs like eager code.
    ``check_every`` is how many steps run between host reads of which rows stopped at a stop id.

    A compiled step is compiled for dynamic rows and widths on its first call, and again when one
    of torch's guards fails: for a call of one row (torch specialises size 1) or for another
    engine's model; moving the weights (sleep, wake) changes no guard. torch stops compiling
    after ``torch._dynamo.config.recompile_limit`` compiles of one code object and runs it
    eagerly, so a process should not build many compiled engines.
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
        self._placeholders = [i for i in placeholder_token_ids(model) if i < self._vocab]
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
        self._slot: Slot | None = None
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
        """Free the cache and every captured graph (their memory goes back to the allocator);
        the next ``decode`` allocates and captures again."""
        if self._slot is not None and self._device.type == "cuda":
            torch.cuda.synchronize(self._device)
        self._slot = None

    def decode(
        self,
        prompts: Sequence[tuple[int, ...]],
        limits: Sequence[int],
        rows: int,
        params: SamplingParams,
        media: Sequence[ProcessedMedia | None] | None = None,
    ) -> DecodeOutput:
        """Generate for every prompt, at most ``limits[i]`` (<= ``params.max_new_tokens``) tokens
        for prompt ``i``, in ``rows`` (<= len(prompts)) cache rows; sequences wait for a free row
        in order. ``media[i]``: prompt ``i``'s processed media (``None``: none)."""
        assert 0 < rows <= len(prompts) == len(limits), (rows, len(prompts), len(limits))
        assert max(limits) <= params.max_new_tokens, (max(limits), params.max_new_tokens)
        # Sized by params, not by this call's limits, so calls of one setting share a cache.
        needed = max(len(prompt) for prompt in prompts) + params.max_new_tokens
        slot = self._slot_for(rows, -(-needed // _LENGTH_BUCKET) * _LENGTH_BUCKET)
        slot.set_sampling(params, self._vocab)
        mode = Mode(
            greedy=params.greedy,
            truncate=not params.greedy and (params.top_k > 0 or params.top_p < 1.0),
            logprobs=params.return_logprobs,
        )
        plan = RowPlan(
            prompts, limits, rows=rows, check_every=self._check_every,
            checks_stops=bool(params.stop_token_ids),
        )  # fmt: skip
        outputs = Outputs(len(prompts), params.max_new_tokens, mode.logprobs, self._device)
        min_new = params.min_new_tokens
        row_steps = prefills = 0
        while True:
            ended = plan.budget_spent()
            if plan.check_due():
                done = slot.done[: plan.bucket].to("cpu").tolist()  # the only device read
                ended += [row for row in plan.live_rows() if done[row] and row not in ended]
            if ended:
                outputs.harvest(slot, ended, plan.end(ended), self._to_device)
            if plan.refill_due():
                self._prefill(slot, plan, plan.take(), mode, min_new, media)
                prefills += 1
                continue  # a refilled row may have spent its budget already
            if not plan.live_count:
                break
            move = plan.compaction()
            if move is not None and move.sources:  # live rows may all lie in the bucket already
                self._move(slot, move)
            columns = self._attended(plan.columns_needed(), slot.length)
            self._run_step(slot, mode, plan.bucket, columns)
            row_steps += plan.bucket
            plan.step += 1
        return outputs.to_host(steps=plan.step, row_steps=row_steps, prefills=prefills)

    def _attended(self, needed: int, length: int) -> int:
        """The columns a step attends to when its live rows reach column ``needed - 1``."""
        if not self._narrow_masks:
            return length
        return min(length, -(-needed // LIVE_BUCKET) * LIVE_BUCKET)

    def _to_device(self, values: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """A host tensor on the device without waiting for the device's queue (on CUDA, a
        pageable copy synchronises the stream; a pinned one is queued like a kernel)."""
        host = (
            values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=torch.long)
        )
        if self._device.type == "cuda":
            return host.pin_memory().to(self._device, non_blocking=True)
        return host.to(self._device)

    # --- memory ----------------------------------------------------------------------------

    def _slot_for(self, rows: int, length: int) -> Slot:
        slot = self._slot
        pointers = tuple(p.data_ptr() for p in self._model.parameters())
        if slot is not None and (slot.rows, slot.length) == (rows, length):
            if slot.weight_pointers != pointers:
                # The weights moved since the graphs were captured: their addresses are stale.
                slot.drop_graphs()
                slot.weight_pointers = pointers
            return slot
        self.release()  # one slot at a time: free the old cache before allocating the new one
        slot = self._slot = Slot(self._model, rows, length, self._vocab, self._dtype, self._device)
        slot.weight_pointers = pointers
        if self._placeholders:
            slot.never[torch.tensor(self._placeholders, device=self._device)] = True
        return slot

    def _run_step(self, slot: Slot, mode: Mode, rows: int, columns: int) -> None:
        if not self._cuda_graphs:
            self._step(slot, mode, rows, columns)
            return
        graph = slot.graphs.get((mode, rows, columns))
        if graph is None:
            graph = slot.graphs[(mode, rows, columns)] = self._capture(slot, mode, rows, columns)
        graph.replay()

    def _capture(self, slot: Slot, mode: Mode, rows: int, columns: int) -> torch.cuda.CUDAGraph:
        """A graph of the step, captured now; the rows' state is as it was before.

        The warm-up runs write each row's cache column and output column that the next real
        step writes again; the counters they advance are put back after each run, and the
        caller's RNG stream after all of them."""
        saved = slot.counters()
        with torch.random.fork_rng(devices=[self._device]), torch.cuda.device(self._device):
            # Warm-ups on the current stream and on a side stream, as PyTorch asks before a
            # capture.
            self._step(slot, mode, rows, columns)
            slot.restore(saved)
            if self._capture_stream is None:
                self._capture_stream = torch.cuda.Stream(self._device)  # type: ignore[no-untyped-call]  # unannotated in torch
            side = self._capture_stream
            side.wait_stream(torch.cuda.current_stream(self._device))
            with torch.cuda.stream(side):
                self._step(slot, mode, rows, columns)
                slot.restore(saved)
            torch.cuda.current_stream(self._device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            if slot.pool is None:
                slot.pool = torch.cuda.graph_pool_handle()
            with torch.cuda.graph(graph, pool=slot.pool, stream=side):
                self._step(slot, mode, rows, columns)
        return graph

    def _move(self, slot: Slot, move: Move) -> None:
        slot.move(self._to_device(move.sources), self._to_device(move.targets))

    # --- the loop --------------------------------------------------------------------------

    def _prefill(
        self,
        slot: Slot,
        plan: RowPlan,
        pairs: Sequence[tuple[int, int]],
        mode: Mode,
        min_new: int,
        media: Sequence[ProcessedMedia | None] | None,
    ) -> None:
        """One forward over the left-padded prompts of ``pairs`` (row, sequence) into their rows,
        from column 0, with their media, then each row's first token.

        An m-RoPE model's prompts take the 3-D positions of ``rope_positions``, and each row
        keeps its delta in the slot: its decode steps add it to the text position."""
        prompts = [plan.prompts[sequence] for _, sequence in pairs]
        limits = [plan.limits[sequence] for _, sequence in pairs]
        width = max(len(prompt) for prompt in prompts)
        count = len(pairs)
        host_ids = torch.full((count, width), PAD_ID, dtype=torch.long)
        for index, prompt in enumerate(prompts):
            host_ids[index, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        settings = torch.tensor(
            [
                [row for row, _ in pairs],
                [width - len(prompt) for prompt in prompts],
                limits,
                [min(min_new, limit) for limit in limits],
            ]
        )
        input_ids = self._to_device(host_ids)
        rows, starts, limit_column, min_steps = self._to_device(settings).unbind(0)
        columns = slot.column_ids[:width]
        present = columns[None, :] >= starts[:, None]
        positions = (columns[None, :] - starts[:, None]).clamp_min(0)
        deltas = torch.zeros(count, dtype=torch.long, device=self._device)
        batch = MediaBatch.build(
            [None if media is None else media[sequence] for _, sequence in pairs],
            offsets=[width - len(prompt) for prompt in prompts],
            width=width,
            device=self._device,
        )
        rope = rope_positions(self._model, input_ids, present.long(), batch)
        if rope is not None:
            positions, deltas = rope
        # A padding slot attends to itself only, so that no row of the mask is empty (an empty
        # row gives NaN in some SDPA kernels, and NaN values poison later masked products).
        query, keys = columns[:, None], columns[None, :]
        visible = (keys <= query) & ((keys == query) | present[:, None, :])
        with slot.cache.prefilling(rows):
            logits = self._model(
                input_ids=input_ids,
                attention_mask=self._additive(visible[:, None]),
                position_ids=positions,
                use_cache=True,
                logits_to_keep=1,
                **{self._cache_keyword: slot.cache},
                **batch.kwargs,
            ).logits
        slot.rope_deltas.index_copy_(0, rows, deltas.to(torch.long))
        slot.starts.index_copy_(0, rows, starts)
        slot.columns.index_fill_(0, rows, width)
        device = self._device
        state = Rows(
            steps=torch.zeros(count, dtype=torch.long, device=device),
            limits=limit_column,
            min_steps=min_steps,
            done=torch.zeros(count, dtype=torch.bool, device=device),
            next_input=torch.empty((count, 1), dtype=torch.long, device=device),
            tokens=torch.empty((count, 1), dtype=torch.long, device=device),
            logprobs=torch.empty((count, 1), dtype=torch.float32, device=device),
        )
        self._sample(slot, state, logits[:, -1], mode)
        slot.store(rows, state)
        plan.start(pairs, width)

    def _step(self, slot: Slot, mode: Mode, rows: int, columns: int) -> None:
        """One decode step of the first ``rows`` rows, attending to the cache's first
        ``columns`` columns."""
        column_ids = slot.column_ids[:columns]
        inputs = (
            slot.next_input[:rows],
            slot.columns[:rows],
            slot.starts[:rows],
            slot.done[:rows],
            slot.rope_deltas[:rows],
        )
        # One compiled step for every width and number of rows, rather than one compile each.
        torch._dynamo.maybe_mark_dynamic(column_ids, 0)
        for tensor in inputs:
            torch._dynamo.maybe_mark_dynamic(tensor, 0)
        logits = self._decode_forward(slot.cache, *inputs, column_ids)
        state = slot.first(rows)
        slot.columns[:rows].add_((~state.done).long())
        self._sample(slot, state, logits, mode)

    def _forward_one(
        self,
        cache: RowCache,
        input_ids: torch.Tensor,
        columns: torch.Tensor,
        starts: torch.Tensor,
        done: torch.Tensor,
        deltas: torch.Tensor,
        column_ids: torch.Tensor,
    ) -> torch.Tensor:
        """Logits ``(rows, vocab)`` of one new token per row, written at the row's column.

        The token's position is its index in its sequence plus its row's m-RoPE delta (0 for a
        text prompt or a model with plain positions), the same on all three m-RoPE axes."""
        visible = (column_ids >= starts[:, None]) & (column_ids <= columns[:, None])
        # A finished row may write past the attended width; it attends to its column 0 then, so
        # that no row of the mask is empty.
        visible |= done[:, None] & (column_ids == 0)
        logits: torch.Tensor = self._model(
            input_ids=input_ids,
            attention_mask=self._additive(visible[:, None, None, :]),
            position_ids=(columns - starts + deltas)[:, None],
            use_cache=True,
            **{self._cache_keyword: cache},
        ).logits
        return logits[:, -1]

    def _additive(self, visible: torch.Tensor) -> torch.Tensor:
        """The additive mask transformers passes to SDPA or eager attention as it is."""
        zero = torch.zeros((), dtype=self._dtype, device=visible.device)
        return torch.where(visible, zero, torch.finfo(self._dtype).min)

    def _sample(self, slot: Slot, state: Rows, logits: torch.Tensor, mode: Mode) -> None:
        """Choose each row's next token, record it at the row's step, and advance."""
        rows = logits.shape[0]
        token, chosen = choose(
            logits,
            mode,
            temperature=slot.temperature,
            top_k_index=slot.top_k_index[:rows],
            top_p=slot.top_p,
            suppressed=slot.never | (slot.stop_columns & (state.steps < state.min_steps)[:, None]),
        )
        token = torch.where(state.done, PAD_ID, token)
        column = state.steps[:, None]
        state.tokens.scatter_(1, column, token[:, None])
        if chosen is not None:
            state.logprobs.scatter_(1, column, chosen)
        state.steps.add_((~state.done).long())
        state.done.logical_or_(slot.stop_columns[token] | (state.steps >= state.limits))
        state.next_input.copy_(token[:, None])
