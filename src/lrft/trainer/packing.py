"""How a micro-batch's sequences are laid out for the trainer's forwards: right-padded rows, or
packed end to end into one row with no padding (``--packing_samples``), split across a
sequence-parallel group when one is set (``--sequence_parallel_size``).

:meth:`TokenLayout.lay_out` gives the model's keyword arguments and where each sequence's tokens
land in the forward's output; :meth:`LaidOut.pick` reads per-token outputs back into
response-aligned ``(B, T, ...)`` tensors, so what follows a forward (logprobs, entropy, values,
losses, :mod:`lrft.algo`) sees the same tensors whichever layout ran it.

A packed row restarts each sequence's positions at 0 (for an m-RoPE model with media, each
sequence's own 3-D positions, computed on the padded batch by the function the engine decodes
with, then packed), and carries its boundaries as :class:`~lrft.models.packed_attention
.PackedRows`, so attention stays inside each sequence. Split across a group of ``S`` ranks, the
row is padded to a multiple of ``S`` tokens (the padding is a sequence of its own) and each rank
computes its own ``1/S`` of the tokens; :meth:`LaidOut.pick` adds the ranks' picks up
(:func:`lrft.dist.sequence_parallel.combine_shards`).
"""

from __future__ import annotations

from typing import Any

import attrs
import torch
import torch.distributed as dist
from torch import Tensor

from lrft.api.errors import CapabilityNotSupported
from lrft.api.protocols import TrainBackend
from lrft.config import TrainConfig
from lrft.dist import RankInfo
from lrft.dist.sequence_parallel import SequenceParallelLayout, combine_shards
from lrft.models.media import MediaBatch, rope_positions
from lrft.models.packed_attention import ROWS_KWARG, PackedRows
from lrft.trainer.sequences import Sequences, forward_inputs, response_positions


@attrs.frozen(kw_only=True, eq=False)
class LaidOut:
    """One forward's inputs and where its sequences' tokens are in the output.

    ``starts``: (B,) each sequence's first token as an index into the output's tokens
    flattened over rows (padded: ``row * width``; packed: its offset in the row).
    ``shard``: ``[start, stop)`` of those indices that this rank's output holds when the row is
    split across ``group``; ``None``: the output holds every token.
    """

    inputs: dict[str, Any]
    starts: Tensor
    lengths: Tensor
    packed: bool
    shard: tuple[int, int] | None = None
    group: dist.ProcessGroup | None = None

    def response_index(self, sequences: Sequences) -> Tensor:
        """(B, T): the output token whose prediction scores each response token."""
        positions = response_positions(sequences)
        if self.packed:  # stay inside the sequence (masked steps past its end read its last)
            positions = torch.minimum(positions, self.lengths[:, None] - 1)
        return self.starts[:, None] + positions

    def last_index(self) -> Tensor:
        """(B,): each sequence's last token."""
        return self.starts + self.lengths - 1

    def local(self, index: Tensor) -> tuple[Tensor, Tensor]:
        """``(held, offsets)``: which of ``index`` this rank's output holds, and their offsets in
        it (clamped into range where not held)."""
        if self.shard is None:
            return torch.ones_like(index, dtype=torch.bool), index
        start, stop = self.shard
        held = (index >= start) & (index < stop)
        return held, (index - start).clamp(0, stop - start - 1)

    def pick(self, output: Tensor, index: Tensor) -> Tensor:
        """``output`` (rows, tokens, *features) at ``index`` (flat token indices, any shape):
        ``(*index.shape, *features)``; differentiable. Collective over ``group``."""
        flat = output.reshape(-1, *output.shape[2:])
        held, offsets = self.local(index.to(flat.device))
        picked = flat[offsets]
        if self.shard is None:
            return picked
        keep = held.reshape(*held.shape, *([1] * (picked.dim() - held.dim())))
        return self.combine(picked * keep)

    def combine(self, values: Tensor) -> Tensor:
        """The sum over the group of each rank's values (zeros at tokens it does not hold)."""
        return combine_shards(values, self.group)


@attrs.frozen(kw_only=True, eq=False)
class TokenLayout:
    """Padded rows (the default), or one packed row per forward (``packed``), split across the
    sequence-parallel ``group`` when it is set (a runtime object, never config)."""

    packed: bool = False
    group: dist.ProcessGroup | None = None

    def __attrs_post_init__(self) -> None:
        if self.group is not None and not self.packed:
            raise ValueError("sequence parallelism splits packed rows: set packed=True")

    @property
    def group_size(self) -> int:
        return 1 if self.group is None else dist.get_world_size(self.group)

    def lay_out(
        self, module: torch.nn.Module, sequences: Sequences, device: torch.device
    ) -> LaidOut:
        """The forward of ``module`` over ``sequences`` in this layout."""
        lengths = sequences.attention_mask.sum(-1)
        if not self.packed:
            width = sequences.input_ids.shape[1]
            return LaidOut(
                inputs=forward_inputs(module, sequences, device),
                starts=torch.arange(len(sequences)) * width,
                lengths=lengths,
                packed=False,
            )
        inputs, rows = packed_inputs(module, sequences, device, self.group)
        starts = torch.cumsum(lengths, 0) - lengths
        return LaidOut(
            inputs=inputs,
            starts=starts,
            lengths=lengths,
            packed=True,
            shard=None if self.group is None else rows.shard(),
            group=self.group,
        )


PADDED = TokenLayout()
"""Right-padded rows, each forward one micro-batch."""


def packed_inputs(
    module: torch.nn.Module,
    sequences: Sequences,
    device: torch.device,
    group: dist.ProcessGroup | None = None,
) -> tuple[dict[str, Any], PackedRows]:
    """The keyword arguments of ``module``'s forward over ``sequences`` packed into one row (see
    module), and the row's boundaries."""
    keep = sequences.attention_mask.bool()
    lengths = [int(n) for n in keep.sum(-1)]
    width = keep.shape[1]
    input_ids = sequences.input_ids[keep]
    positions = torch.arange(width).expand(len(sequences), width)[keep][None]
    media: dict[str, Tensor] = {}
    if sequences.media:
        batch = MediaBatch.build(
            sequences.media, offsets=[0] * len(sequences), width=width, device=torch.device("cpu")
        )
        token_names = {name for m in sequences.media if m is not None for name in m.token_tensors}
        for name, value in batch.kwargs.items():
            media[name] = value[keep][None] if name in token_names else value
        rope = rope_positions(module, sequences.input_ids, sequences.attention_mask, batch)
        if rope is not None:
            positions = rope[0][:, keep][:, None, :]
    size = 1 if group is None else dist.get_world_size(group)
    padding = -len(input_ids) % size
    if padding:
        # a sequence of its own, so that no real token attends to it
        input_ids = torch.cat([input_ids, torch.zeros(padding, dtype=input_ids.dtype)])
        extra = torch.arange(padding).expand(*positions.shape[:-1], padding)
        positions = torch.cat([positions, extra], dim=-1)
        lengths.append(padding)
    rows = PackedRows.of_lengths(lengths, device, group)
    inputs: dict[str, Any] = {
        "input_ids": input_ids[None].to(device),
        "position_ids": positions.to(device),
        "use_cache": False,
        ROWS_KWARG: rows,
    }
    inputs.update({name: value.to(device) for name, value in media.items()})
    return inputs, rows


def token_layout(config: TrainConfig, info: RankInfo, backend: TrainBackend) -> TokenLayout:
    """How the training forwards lay their rows out (:mod:`lrft.trainer.packing`): padded, or
    packed with ``packing_samples`` and split over this rank's sequence-parallel group. Refuses a
    backend that does not declare what that needs. Collective (the groups are created)."""
    if not config.packing_samples:
        return PADDED
    size = config.sequence_parallel_size
    needed = ("packed_sequences",) + (("sequence_parallel",) if size > 1 else ())
    for capability in needed:
        if capability not in backend.capabilities.names():
            raise CapabilityNotSupported(
                backend.name,
                capability,
                f"--packing_samples{f' --sequence_parallel_size {size}' if size > 1 else ''} "
                "needs a train backend that declares it",
            )
    group = SequenceParallelLayout(world_size=info.world_size, sp_size=size).build_group()
    return TokenLayout(packed=True, group=group)
