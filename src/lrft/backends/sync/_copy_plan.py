""":class:`CopyPlan`: :func:`copy_with_digest` of one list of tensors, prepared once and run
again and again (a weight sync's bucket, step after step)."""

from __future__ import annotations

import functools
import operator
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from lrft.backends.sync._copy_table import CopyTable
from lrft.kernels import Replay, digest_sums_many

_SHAPE = operator.attrgetter("shape")
_DTYPE = operator.attrgetter("dtype")


def copy_with_digest(
    sources: Sequence[torch.Tensor],
    targets: Sequence[torch.Tensor],
    positions: Sequence[int],
    out: torch.Tensor,
) -> None:
    """Copies each source into its target, cast to the target's dtype, and adds the fingerprint
    sums (``lrft.api.digest``) of the values written to ``out[position]`` (``out``: ``(k, 2)``
    int64 on the targets' device, zero where nothing was added yet), without a host sync.

    This is how a weight sync writes straight into an engine's storage and still knows what it
    sent. On CUDA, contiguous floating-point tensors go through a Triton kernel (one launch per
    pair of dtypes) that casts and writes each row, then reads its words back and sums them into
    ``out`` with atomics: the copy's traffic and a re-read of what it wrote.
    Anything else is copied and then fingerprinted from the targets. :class:`CopyPlan` does
    the same for a list of tensors copied again and again.
    """
    CopyPlan(sources, targets, positions, out.device).run(sources, targets, out)


class CopyKernel(NamedTuple):
    """The fused copy-and-fingerprint kernels: ``prepare`` moves a :class:`CopyTable` to the
    device, ``launch`` runs the copy it describes; and the dtypes and row length they take."""

    prepare: Callable[[CopyTable, torch.device], object]
    # Any: the prepared table's type lives in the Triton module, importable only with Triton.
    launch: Callable[[Any, torch.Tensor], None]
    dtypes: frozenset[torch.dtype]
    words: int


@functools.cache
def copy_kernel() -> CopyKernel | None:
    try:
        from lrft.backends.sync._copy_kernel import (
            COPY_DTYPES,
            COPY_WORDS,
            launch_copy,
            prepare_copy,
        )
    except ImportError:  # a torch build without Triton: copy, then fingerprint the copies
        return None
    return CopyKernel(prepare_copy, launch_copy, COPY_DTYPES, COPY_WORDS)


class CopyPlan:
    """:func:`copy_with_digest` of one list of tensors, prepared for being run again: the
    checks of every tensor and the kernels' tables on the device are made once, and on CUDA the
    kernel launches are replayed from a CUDA graph from the plan's second run on (one graph
    launch for the plan's kernels, one per pair of dtypes: launches dominate a small bucket on a
    slow host).

    A plan refers to its tensors by address. :meth:`matches` says whether other lists may run
    through it: sources of the same addresses, shapes, dtypes, layout and device (the same
    tensors with new values, or new tensors where the old ones were), and the very same target
    tensors, still at their addresses (an engine lends the same views while its storage stays
    where it is). A weight sync keeps a plan per bucket and checks it so, which costs a few
    property reads per tensor instead of the checks and a table transfer per bucket. The plan
    holds no reference to its tensors, only to the last ``out`` it ran with, and its kernels
    need no temporary memory.
    """

    def __init__(
        self,
        sources: Sequence[torch.Tensor],
        targets: Sequence[torch.Tensor],
        positions: Sequence[int],
        device: torch.device,
    ) -> None:
        self.device = device
        self._sources = _source_key(sources)
        self._targets = _LentTargets(targets)
        self._positions = list(positions)
        # One pass over the tensors that checks them and writes the kernels' tables as it goes.
        index = device.index if device.type == "cuda" else None
        kernel = copy_kernel() if index is not None else None
        tables: dict[tuple[torch.dtype, torch.dtype], CopyTable] = {}
        self._rest: list[int] = []
        for i, (source, target) in enumerate(zip(sources, targets, strict=True)):
            if source.shape != target.shape:
                raise ValueError(
                    f"copy_with_digest: source {i} has shape {tuple(source.shape)}, its target "
                    f"{tuple(target.shape)}"
                )
            if kernel is not None:
                pair = (source.dtype, target.dtype)
                table = tables.get(pair)
                if table is None and pair[0] in kernel.dtypes and pair[1] in kernel.dtypes:
                    table = tables[pair] = CopyTable(pair[0], pair[1], kernel.words)
                if (
                    table is not None
                    and source.get_device() == index
                    and target.get_device() == index
                    and source.is_contiguous()
                    and target.is_contiguous()
                ):
                    address = target.data_ptr()
                    if address % 4 == 0:  # the kernel reads the written words back as int32
                        table.add(source.data_ptr(), address, target.numel(), positions[i])
                        continue
            self._rest.append(i)
        self._launch = kernel.launch if kernel is not None else None
        self._prepared = [
            kernel.prepare(table, device)
            for table in tables.values()
            if kernel is not None and table.rows
        ]
        self._rest_positions = (
            torch.tensor([positions[i] for i in self._rest], dtype=torch.int64).to(device)
            if self._rest
            else None
        )
        self._replay: tuple[torch.Tensor, Replay] | None = None

    def matches(
        self,
        sources: Sequence[torch.Tensor],
        targets: Sequence[torch.Tensor],
        positions: Sequence[int],
    ) -> bool:
        """Whether these lists may run through this plan: every source at the address, of the
        shape, dtype, layout and device it was prepared for; the same target tensors at the
        same addresses; and the same positions."""
        return (
            list(positions) == self._positions
            and self._targets.same_as(targets)
            and self.matches_sources(sources)
        )

    def matches_sources(self, sources: Sequence[torch.Tensor]) -> bool:
        """:meth:`matches` for a caller that knows the targets are the plan's own, still at
        their addresses: every source at the address, of the shape, dtype and layout it was
        prepared for."""
        return _source_key(sources) == self._sources

    @property
    def captured(self) -> bool:
        """Whether the kernels now replay from a CUDA graph (from the second run into the same
        ``out`` on)."""
        return self._replay is not None and self._replay[1].captured

    def run(
        self,
        sources: Sequence[torch.Tensor],
        targets: Sequence[torch.Tensor],
        out: torch.Tensor,
    ) -> None:
        """The copy and the sums into ``out`` (on the plan's device), for the lists the plan
        was made from or that :meth:`matches` accepted. The kernels write to the targets'
        addresses as planned; ``targets`` are read for the tensors copied outside them (odd
        dtypes, layouts or alignment, and everything off CUDA)."""
        if out.device != self.device:
            raise ValueError(f"CopyPlan for {self.device} run with out on {out.device}")
        if self._prepared:
            if self._replay is None or self._replay[0] is not out:
                self._replay = (out, Replay(functools.partial(self._kernels, out), self.device))
            self._replay[1]()
        if self._rest_positions is not None:
            written = [targets[i] for i in self._rest]
            torch._foreach_copy_(written, [sources[i] for i in self._rest])
            out.index_add_(0, self._rest_positions, digest_sums_many(written))

    def _kernels(self, out: torch.Tensor) -> None:
        assert self._launch is not None
        for prepared in self._prepared:
            self._launch(prepared, out)


class _LentTargets:
    """Targets by identity (weakly held, so a plan keeps no engine storage alive) and address."""

    def __init__(self, targets: Sequence[torch.Tensor]) -> None:
        self._refs = list(map(weakref.ref, targets))
        self._addresses = list(map(torch.Tensor.data_ptr, targets))

    def same_as(self, targets: Sequence[torch.Tensor]) -> bool:
        return (
            len(targets) == len(self._refs)
            and list(map(torch.Tensor.data_ptr, targets)) == self._addresses
            and all(map(operator.is_, map(operator.call, self._refs), targets))
        )


def _source_key(sources: Sequence[torch.Tensor]) -> tuple[list[object], ...]:
    # One C call per tensor and property (map over the unbound methods, no Python frame). No
    # device: addresses are unique across the host and every device of a process (CUDA's
    # unified addressing), so the address fixes it.
    return (
        list(map(torch.Tensor.data_ptr, sources)),
        list(map(_SHAPE, sources)),
        list(map(_DTYPE, sources)),
        list(map(torch.Tensor.is_contiguous, sources)),
    )
