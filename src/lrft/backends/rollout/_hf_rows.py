"""The host's side of the static loop: which sequence each cache row holds, and when to act.

The loop decodes a queue of sequences in a fixed number of cache rows. The host never reads the
device to know a row's length or column: it knows when each row was prefilled, how wide its
prefill was and its token budget, so it knows each row's column and the step at which its budget
runs out. Only a row that ends at a stop id needs a device read, which the loop makes every
``check_every`` steps when stop ids are set. Everything the plan decides is a function of the
sequences, the settings and those reads, so a seeded call gives the same results however fast
the host runs.

Between two steps the plan may:

- refill: give free rows the next waiting sequences (in order, lowest rows first), once at least
  ``ceil(rows / REFILL_SHARE)`` rows are free (or every waiting sequence fits, or no row is
  live): each refill is one prefill, so rows are refilled in groups;
- compact: once nothing waits, move the live rows to the front so that a step runs over the
  smallest bucket of rows (``row_buckets``) that holds them.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import attrs

REFILL_SHARE = 8
"""A refill waits for at least a 1/REFILL_SHARE share of the rows to be free."""
MIN_ROW_BUCKET = 4
"""The fewest rows a compacted step runs over (fewer saves little: a step reads every weight)."""


def row_buckets(rows: int) -> tuple[int, ...]:
    """The row counts a step may run over, largest first: ``rows`` and each power of two below
    it, down to ``MIN_ROW_BUCKET``."""
    buckets = [rows]
    size = MIN_ROW_BUCKET
    while size < rows:
        buckets.append(size)
        size *= 2
    return tuple(sorted(set(buckets), reverse=True))


@attrs.frozen(kw_only=True)
class Move:
    """Live rows ``sources`` go to free rows ``targets``; steps then run over ``bucket`` rows."""

    sources: tuple[int, ...]
    targets: tuple[int, ...]
    bucket: int


class RowPlan:
    """Bookkeeping of one ``generate`` call's rows (see module doc).

    ``step`` counts the decode steps run so far; a row prefilled when ``step`` was ``t0`` has
    generated ``step - t0 + 1`` tokens and writes its next one at column ``width + step - t0``.
    What a plain step asks of the plan (rows whose budget ran out, the columns to attend to)
    costs no pass over the rows: each live sequence's last step is filed when it starts.
    """

    def __init__(
        self,
        prompts: Sequence[tuple[int, ...]],
        limits: Sequence[int],
        *,
        rows: int,
        check_every: int,
        checks_stops: bool,
    ) -> None:
        assert len(prompts) == len(limits), (len(prompts), len(limits))
        assert 0 < rows <= len(prompts), (rows, len(prompts))
        self.prompts, self.limits = list(prompts), list(limits)
        self.rows = rows
        self.buckets = row_buckets(rows)
        self.bucket = rows
        self.check_every = check_every
        self.checks_stops = checks_stops
        self.step = 0
        self.waiting = collections.deque(range(len(prompts)))
        self.sequence: list[int | None] = [None] * rows
        self.live = [False] * rows
        self.live_count = 0
        self._started = [0] * rows
        self._width = [0] * rows
        self._row_of: dict[int, int] = {}  # live sequence -> its row
        self._last_steps: dict[int, list[int]] = collections.defaultdict(list)
        self._reach = 0  # max over live rows of width - started
        self._last_check = 0

    # --- what the rows hold ---------------------------------------------------------------

    def live_rows(self) -> list[int]:
        """Rows decoding a sequence not yet known to have ended."""
        return [row for row in range(self.rows) if self.live[row]]

    def free_rows(self) -> list[int]:
        return [row for row in range(self.rows) if not self.live[row]]

    def take(self) -> list[tuple[int, int]]:
        """(row, sequence) pairs: the next waiting sequences in the free rows, lowest first."""
        pairs = []
        for row in self.free_rows():
            if not self.waiting:
                break
            pairs.append((row, self.waiting.popleft()))
        return pairs

    def start(self, pairs: Sequence[tuple[int, int]], width: int) -> None:
        """The rows of ``pairs`` were prefilled ``width`` columns wide, before step ``step``."""
        for row, sequence in pairs:
            assert not self.live[row], row
            self.sequence[row] = sequence
            self.live[row] = True
            self._started[row] = self.step
            self._width[row] = width
            self._row_of[sequence] = row
            self._last_steps[self.step + self.limits[sequence] - 1].append(sequence)
        self.live_count += len(pairs)
        self._update_reach()

    def budget_spent(self) -> list[int]:
        """Live rows whose sequence has all the tokens its limit allows."""
        due = self._last_steps.pop(self.step, [])
        return [self._row_of[sequence] for sequence in due if sequence in self._row_of]

    def end(self, rows: Sequence[int]) -> list[int]:
        """Mark ``rows`` finished; returns their sequences, in the order of ``rows``."""
        sequences = []
        for row in rows:
            sequence = self.sequence[row]
            assert self.live[row], row
            assert sequence is not None, row
            self.live[row] = False
            del self._row_of[sequence]
            sequences.append(sequence)
        self.live_count -= len(rows)
        self._update_reach()
        return sequences

    def _update_reach(self) -> None:
        self._reach = max(
            (self._width[row] - self._started[row] for row in self.live_rows()), default=0
        )

    # --- decisions --------------------------------------------------------------------------

    def check_due(self) -> bool:
        """Whether the host reads the rows' stop flags before the next step."""
        if not self.checks_stops or self.step - self._last_check < self.check_every:
            return False
        self._last_check = self.step
        return True

    def refill_due(self) -> bool:
        if not self.waiting:
            return False
        free = self.rows - self.live_count
        if free == self.rows:
            return True
        return free >= min(-(-self.rows // REFILL_SHARE), len(self.waiting))

    def compaction(self) -> Move | None:
        """The move that lets steps run over fewer rows, once nothing waits."""
        if self.waiting:
            return None
        bucket = min(size for size in self.buckets if size >= self.live_count)
        if bucket >= self.bucket:
            return None
        sources = tuple(row for row in self.live_rows() if row >= bucket)
        targets = tuple(row for row in range(bucket) if not self.live[row])[: len(sources)]
        for source, target in zip(sources, targets, strict=True):
            sequence = self.sequence[source]
            assert sequence is not None, source
            self.sequence[target], self.sequence[source] = sequence, None
            self.live[target], self.live[source] = True, False
            self._started[target] = self._started[source]
            self._width[target] = self._width[source]
            self._row_of[sequence] = target
        self.bucket = bucket
        return Move(sources=sources, targets=targets, bucket=bucket)

    def columns_needed(self) -> int:
        """The cache columns the next step reads: up to the last one a live row writes."""
        return self.step + self._reach + 1 if self.live_count else 1
