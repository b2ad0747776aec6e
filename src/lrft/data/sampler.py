"""A resumable distributed sampler over global batches of prompt indices.

Pure Python and torch: rank and world size are passed in, no process group is needed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping

import attrs
import torch

from lrft.api import validators as v
from lrft.api.errors import ConfigError


@attrs.frozen(kw_only=True)
class SamplerPosition:
    """Where a sampler stands: in ``epoch``, after ``consumed_samples`` samples of that epoch.

    ``consumed_samples`` counts global samples (all ranks together) and is a multiple of the
    global batch size. A finished epoch is stored as the start of the next one.
    """

    epoch: int = attrs.field(default=0, validator=v.non_negative_int)
    consumed_samples: int = attrs.field(default=0, validator=v.non_negative_int)


@attrs.frozen(kw_only=True)
class SamplerBatch:
    """This rank's share of one global batch: ``indices`` into the dataset, in order."""

    epoch: int
    index: int
    """The batch's position in its epoch (0-based)."""
    indices: tuple[int, ...]


_STATE_FIELDS = ("num_samples", "global_batch_size", "seed", "shuffle", "drop_last")
"""The settings a saved position is only meaningful under; a resume must match each of them."""


def _epoch_seed(seed: int, epoch: int) -> int:
    # Hash the pair instead of adding them (as torch's DistributedSampler does), so that seed s
    # in epoch 1 does not replay seed s + 1 in epoch 0.
    digest = hashlib.blake2b(f"lrft-sampler/{seed}/{epoch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def eval_indices(num_samples: int, *, rank: int, world_size: int) -> range:
    """This rank's indices for one pass over an evaluation set: every index exactly once overall.

    Strided (``rank, rank + world_size, ...``), with no padding, so ranks may get counts that
    differ by one; no shuffling and no state, since evaluation must not move the training data's
    position.
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"world_size must be a positive integer, got {world_size!r}")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank!r} is outside [0, world_size={world_size})")
    if num_samples < 0:
        raise ConfigError(f"num_samples must be >= 0, got {num_samples}")
    return range(rank, num_samples, world_size)


class DistributedPromptSampler:
    """Hands each rank its disjoint share of each global batch, epoch after epoch, resumably.

    Every epoch orders the ``num_samples`` indices — a permutation drawn from ``seed`` and the
    epoch number when ``shuffle``, else ``0, 1, ...`` — and cuts that order into global batches of
    ``global_batch_size`` samples. Rank ``r`` of ``world_size`` gets the ``r``-th contiguous slice
    of ``global_batch_size // world_size`` indices of each batch, so the ranks' shares of a batch
    are disjoint and together are the whole batch.

    ``drop_last`` says what happens to the ``num_samples % global_batch_size`` indices left over
    at the end of an epoch's order:

    - ``True`` (default): they are not sampled in this epoch (the next epoch's order differs
      when shuffling, so other indices are left over then). Every index appears at most once per
      epoch; exactly once when ``global_batch_size`` divides ``num_samples``.
    - ``False``: the last batch is completed with the first indices of the same epoch's order
      (cycling if it needs more than ``num_samples``, when one batch may then hold an index
      twice), so every index appears at least once per epoch and a few twice. For evaluation,
      where a repeated prompt would bias the score, use :func:`eval_indices` instead.

    :meth:`next_batch` hands out the next batch and advances the position; iterating the sampler
    yields the batches left in the current epoch. :meth:`state_dict` captures the position
    (epoch, samples consumed in it) with the settings it depends on; a new sampler that loads it
    hands out exactly the batches that the saved one would have handed out next.

    **Resuming at a different world size** is supported: the position is counted in global
    samples and the order depends only on ``seed``, the epoch and ``num_samples``, never on the
    world size, so the run continues with the same global batches, split into shares for the new
    number of ranks (``global_batch_size`` must divide by the new world size). A rank's own
    future indices then differ from what that rank would have had; the union over ranks does
    not. Loading a state saved with a different ``num_samples``, ``global_batch_size``, ``seed``,
    ``shuffle`` or ``drop_last`` raises :class:`ConfigError`, since the saved position would
    then point at other samples.

    The sampler hands out positions, not data; wrapping it in a prefetching ``DataLoader`` would
    advance it past what was trained on. Call :meth:`next_batch` when a batch is consumed and
    save :meth:`state_dict` with the checkpoint.
    """

    def __init__(
        self,
        *,
        num_samples: int,
        global_batch_size: int,
        rank: int,
        world_size: int,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
    ) -> None:
        for name, value in (
            ("num_samples", num_samples),
            ("global_batch_size", global_batch_size),
            ("world_size", world_size),
        ):
            if not v.is_int(value) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ConfigError(f"rank {rank!r} is outside [0, world_size={world_size})")
        if global_batch_size % world_size:
            raise ConfigError(
                f"global_batch_size {global_batch_size} is not divisible by world_size "
                f"{world_size} (global_batch_size % world_size = "
                f"{global_batch_size % world_size}, must be 0)"
            )
        if drop_last and num_samples < global_batch_size:
            raise ConfigError(
                f"num_samples {num_samples} < global_batch_size {global_batch_size}: with "
                "drop_last=True an epoch would hold no batch"
            )
        self.num_samples = num_samples
        self.global_batch_size = global_batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = int(seed)
        self.shuffle = shuffle
        self.drop_last = drop_last
        self._position = SamplerPosition()
        self._order_cache: tuple[int, list[int]] | None = None

    @property
    def per_rank_batch_size(self) -> int:
        return self.global_batch_size // self.world_size

    @property
    def batches_per_epoch(self) -> int:
        full, rest = divmod(self.num_samples, self.global_batch_size)
        return full if self.drop_last or not rest else full + 1

    @property
    def samples_per_epoch(self) -> int:
        """Global samples handed out per epoch (padding included when ``drop_last=False``)."""
        return self.batches_per_epoch * self.global_batch_size

    @property
    def position(self) -> SamplerPosition:
        return self._position

    @property
    def epoch(self) -> int:
        return self._position.epoch

    @property
    def total_consumed_samples(self) -> int:
        """Global samples handed out since the start of training, over all epochs."""
        return self._position.epoch * self.samples_per_epoch + self._position.consumed_samples

    def epoch_order(self, epoch: int) -> list[int]:
        """The ``samples_per_epoch`` indices of ``epoch``, in the order they are handed out."""
        if self._order_cache is not None and self._order_cache[0] == epoch:
            return self._order_cache[1]
        if self.shuffle:
            generator = torch.Generator().manual_seed(_epoch_seed(self.seed, epoch))
            order: list[int] = torch.randperm(self.num_samples, generator=generator).tolist()
        else:
            order = list(range(self.num_samples))
        needed = self.samples_per_epoch
        while len(order) < needed:  # drop_last=False: complete the last batch from the start
            order.extend(order[: needed - len(order)])
        order = order[:needed]
        self._order_cache = (epoch, order)
        return order

    def global_batch(self, epoch: int, index: int) -> tuple[int, ...]:
        """All ranks' indices of batch ``index`` of ``epoch`` (rank 0's share first)."""
        if not 0 <= index < self.batches_per_epoch:
            raise IndexError(f"batch {index} is outside [0, {self.batches_per_epoch})")
        start = index * self.global_batch_size
        return tuple(self.epoch_order(epoch)[start : start + self.global_batch_size])

    def rank_share(self, global_batch: tuple[int, ...]) -> tuple[int, ...]:
        """This rank's contiguous slice of a global batch."""
        size = self.per_rank_batch_size
        return global_batch[self.rank * size : (self.rank + 1) * size]

    def next_batch(self) -> SamplerBatch:
        """This rank's share of the next global batch; advances the position past it."""
        epoch, consumed = self._position.epoch, self._position.consumed_samples
        index = consumed // self.global_batch_size
        batch = SamplerBatch(
            epoch=epoch, index=index, indices=self.rank_share(self.global_batch(epoch, index))
        )
        consumed += self.global_batch_size
        if consumed >= self.samples_per_epoch:
            epoch, consumed = epoch + 1, 0
        self._position = SamplerPosition(epoch=epoch, consumed_samples=consumed)
        return batch

    def __iter__(self) -> Iterator[SamplerBatch]:
        """The batches left in the current epoch; the position advances as each is yielded."""
        epoch = self._position.epoch
        while self._position.epoch == epoch:
            yield self.next_batch()

    def __len__(self) -> int:
        """Batches left in the current epoch."""
        return self.batches_per_epoch - self._position.consumed_samples // self.global_batch_size

    def state_dict(self) -> dict[str, int | bool]:
        """The position and the settings it depends on; plain JSON-serialisable values."""
        return {
            "epoch": self._position.epoch,
            "consumed_samples": self._position.consumed_samples,
            "num_samples": self.num_samples,
            "global_batch_size": self.global_batch_size,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "world_size": self.world_size,  # informational: a resume may change it
        }

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Continue from a saved position (see the class docstring on world size)."""
        current = self.state_dict()
        for name in ("epoch", "consumed_samples", *_STATE_FIELDS):
            if name not in state:
                raise ConfigError(f"sampler state has no {name!r}; keys: {sorted(state)}")
        for name in _STATE_FIELDS:
            if state[name] != current[name] or type(state[name]) is not type(current[name]):
                raise ConfigError(
                    f"sampler state was saved with {name}={state[name]!r} but this sampler has "
                    f"{name}={current[name]!r}; the saved position would point at other samples"
                )
        epoch, consumed = state["epoch"], state["consumed_samples"]
        if not isinstance(epoch, int) or not isinstance(consumed, int):
            raise ConfigError(f"sampler state epoch/consumed_samples must be integers: {state}")
        if consumed % self.global_batch_size or not 0 <= consumed < self.samples_per_epoch:
            raise ConfigError(
                f"sampler state consumed_samples={consumed} is not a multiple of "
                f"global_batch_size {self.global_batch_size} in [0, {self.samples_per_epoch})"
            )
        self._position = SamplerPosition(epoch=epoch, consumed_samples=consumed)
