"""The host side of the copy kernel's table (``_copy_kernel``), built by ``CopyPlan``."""

from __future__ import annotations

import torch


class CopyTable:
    """The fused copy kernel's table for one pair of dtypes: per tensor its first row (of
    ``words`` words of the target) among all the table's rows, the source and target addresses,
    the element count and the position its sums go to."""

    def __init__(self, source: torch.dtype, target: torch.dtype, words: int) -> None:
        self.source = source
        self.target = target
        self.words = words
        self.facts: list[int] = []
        self.rows = 0
        self._row_elements = words * 4 // target.itemsize

    def add(self, source: int, target: int, numel: int, position: int) -> None:
        if numel:
            self.facts += (self.rows, source, target, numel, position)
            self.rows += -(-numel // self._row_elements)
