"""The static loop's memory: one cache shape's buffers, and one call's results.

A ``Slot`` holds what a captured decode step reads and writes, at fixed addresses: the
``RowCache``, every row's decoding state and the sampling settings, and the graphs captured on
them. ``Outputs`` collects a call's results by sequence, on the device, as rows finish (a
row's buffers are reused by the sequence that refills it), and copies them to the host once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

import attrs
import torch

from lrft.api.types import SamplingParams
from lrft.backends.rollout._hf_cache import RowCache
from lrft.backends.rollout._hf_sampling import Mode

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE

# Left padding and the steps of rows that already stopped hold this id; both are masked or cut
# off, so any id in the vocabulary does.
PAD_ID = 0


@attrs.frozen(kw_only=True)
class DecodeOutput:
    """What one call generated, on the host: ``tokens`` and (when asked) ``logprobs`` of shape
    ``(sequences, max_new_tokens)``, of which sequence ``i`` holds its first ``lengths[i]``.

    ``steps`` is how many decode steps ran and ``row_steps`` the rows they ran over, summed: the
    work the call cost, in rows times steps; ``prefills`` counts the prefill forwards (the
    first one and each refill)."""

    tokens: torch.Tensor
    lengths: torch.Tensor
    logprobs: torch.Tensor | None
    steps: int
    row_steps: int
    prefills: int


@attrs.frozen(kw_only=True)
class Rows:
    """Per-row decoding state of some rows: views of a slot's buffers (a step's first rows) or
    tensors of their own (rows being prefilled, stored into the slot afterwards)."""

    steps: torch.Tensor  # tokens generated so far: the output column of the next one
    limits: torch.Tensor  # the token budget
    min_steps: torch.Tensor  # stop ids are suppressed while steps < min_steps
    done: torch.Tensor
    next_input: torch.Tensor  # (rows, 1): the token the next step feeds
    tokens: torch.Tensor  # (rows, columns): the generated ids, by step
    logprobs: torch.Tensor  # (rows, columns)


class Slot:
    """The fixed-address memory of one ``(rows, cache_length)`` shape: the cache, every row's
    state, the sampling settings, and the graphs captured on them."""

    def __init__(
        self,
        model: torch.nn.Module,
        rows: int,
        length: int,
        vocab: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        from transformers import PreTrainedConfig

        self.rows, self.length = rows, length
        config = cast(PreTrainedConfig, model.config)
        self.cache = RowCache(config, rows=rows, length=length, dtype=dtype, device=device)
        self.column_ids = torch.arange(length, device=device)
        self.starts = torch.zeros(rows, dtype=torch.long, device=device)
        # m-RoPE: how far each row's positions after its prompt are ahead of their index
        self.rope_deltas = torch.zeros(rows, dtype=torch.long, device=device)
        self.steps = torch.zeros(rows, dtype=torch.long, device=device)
        self.limits = torch.ones(rows, dtype=torch.long, device=device)
        self.min_steps = torch.zeros(rows, dtype=torch.long, device=device)
        # every row starts finished: a step over an empty row attends to its column 0 only
        self.done = torch.ones(rows, dtype=torch.bool, device=device)
        self.next_input = torch.full((rows, 1), PAD_ID, dtype=torch.long, device=device)
        # Outputs by step; a finished row keeps writing padding at the column past its last
        # token, which is why there is one column more than any budget (length > max tokens).
        self.tokens = torch.full((rows, length), PAD_ID, dtype=torch.long, device=device)
        self.logprobs = torch.zeros((rows, length), dtype=torch.float32, device=device)
        self.temperature = torch.ones((), dtype=torch.float32, device=device)
        self.top_p = torch.ones((), dtype=torch.float32, device=device)
        self.top_k_index = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self.stop_columns = torch.zeros(vocab, dtype=torch.bool, device=device)
        # ids never sampled: the model's media placeholders (lrft.models.media)
        self.never = torch.zeros(vocab, dtype=torch.bool, device=device)
        # One graph per mode, rows and attended width; they share one memory pool, as they never
        # run at once and each leaves its results in the buffers above, not in the pool.
        self.graphs: dict[tuple[Mode, int, int], torch.cuda.CUDAGraph] = {}
        self.pool: _POOL_HANDLE | None = None
        self.weight_pointers: tuple[int, ...] = ()

    @property
    def columns(self) -> torch.Tensor:
        """The column each row writes next (the cache's own tensor)."""
        return self.cache.columns

    def first(self, rows: int) -> Rows:
        return Rows(
            steps=self.steps[:rows],
            limits=self.limits[:rows],
            min_steps=self.min_steps[:rows],
            done=self.done[:rows],
            next_input=self.next_input[:rows],
            tokens=self.tokens[:rows],
            logprobs=self.logprobs[:rows],
        )

    def store(self, index: torch.Tensor, state: Rows) -> None:
        """Write prefilled rows' state into rows ``index``."""
        for name in ("steps", "limits", "min_steps", "done", "next_input"):
            getattr(self, name).index_copy_(0, index, getattr(state, name))
        width = state.tokens.shape[1]
        self.tokens[:, :width].index_copy_(0, index, state.tokens)
        self.logprobs[:, :width].index_copy_(0, index, state.logprobs)

    _MOVED = (
        "starts",
        "rope_deltas",
        "columns",
        "steps",
        "limits",
        "min_steps",
        "done",
        "next_input",
    )

    def move(self, sources: torch.Tensor, targets: torch.Tensor) -> None:
        """Rows ``sources`` (cache included) to rows ``targets``; the sources end finished."""
        self.cache.move_rows(sources, targets)
        for name in (*self._MOVED, "tokens", "logprobs"):
            buffer: torch.Tensor = getattr(self, name)
            buffer.index_copy_(0, targets, buffer.index_select(0, sources))
        self.done.index_fill_(0, sources, True)

    def counters(self) -> list[torch.Tensor]:
        """Copies of what a step advances (a capture puts them back)."""
        return [
            self.columns.clone(),
            self.steps.clone(),
            self.done.clone(),
            self.next_input.clone(),
        ]

    def restore(self, saved: list[torch.Tensor]) -> None:
        for buffer, value in zip(
            (self.columns, self.steps, self.done, self.next_input), saved, strict=True
        ):
            buffer.copy_(value)

    def drop_graphs(self) -> None:
        self.graphs.clear()
        self.pool = None

    def set_sampling(self, params: SamplingParams, vocab: int) -> None:
        self.temperature.fill_(1.0 if params.greedy else params.temperature)
        self.top_p.fill_(params.top_p)
        # top-k keeps the k largest scores: their threshold is entry vocab-k of the ascending
        # sort (k = 0 disables it: entry 0, the smallest, removes nothing).
        k = min(params.top_k, vocab)
        self.top_k_index.fill_(vocab - k if k > 0 else 0)
        self.stop_columns.zero_()
        stops = [token for token in params.stop_token_ids if token < vocab]
        if stops:
            self.stop_columns[torch.tensor(stops, device=self.stop_columns.device)] = True


class Outputs:
    """One call's results on the device, by sequence; rows are copied in as they finish."""

    def __init__(self, sequences: int, max_new: int, logprobs: bool, device: torch.device):
        self.max_new = max_new
        self.tokens = torch.full((sequences, max_new), PAD_ID, dtype=torch.long, device=device)
        self.logprobs = (
            torch.zeros((sequences, max_new), dtype=torch.float32, device=device)
            if logprobs
            else None
        )
        self.lengths = torch.zeros(sequences, dtype=torch.long, device=device)

    def harvest(
        self,
        slot: Slot,
        rows: Sequence[int],
        sequences: Sequence[int],
        to_device: Callable[[Sequence[int]], torch.Tensor],
    ) -> None:
        source, target = to_device(rows), to_device(sequences)
        self.tokens.index_copy_(0, target, slot.tokens.index_select(0, source)[:, : self.max_new])
        self.lengths.index_copy_(0, target, slot.steps.index_select(0, source))
        if self.logprobs is not None:
            chosen = slot.logprobs.index_select(0, source)[:, : self.max_new]
            self.logprobs.index_copy_(0, target, chosen)

    def to_host(self, *, steps: int, row_steps: int, prefills: int) -> DecodeOutput:
        return DecodeOutput(
            tokens=self.tokens.to("cpu"),
            lengths=self.lengths.to("cpu"),
            logprobs=None if self.logprobs is None else self.logprobs.to("cpu"),
            steps=steps,
            row_steps=row_steps,
            prefills=prefills,
        )
