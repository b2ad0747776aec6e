"""The packing and sequence-parallel checks of ``TrainBackendSuite`` (mixed into it): a backend
that declares ``packed_sequences`` trains on packed rows as a plain model trains on padded ones,
and one that declares ``sequence_parallel`` trains on rows split over sequence-parallel groups
of 2 (and 4) ranks as on unsplit ones (:mod:`lrft.testing.conformance._train_long_ranks`)."""

from __future__ import annotations

import pytest

from lrft.testing.conformance._train_hooks import B, TrainBackendHooks
from lrft.testing.conformance._train_long_ranks import (
    packed_training_matches_padded,
    sequence_parallel_matches_unsplit,
)
from lrft.testing.distributed import RankPool

__all__ = [
    "LongSequenceChecks",
    "packed_training_matches_padded",
    "sequence_parallel_matches_unsplit",
]

SEQUENCE_PARALLEL_SIZES = (2, 4)
"""The group sizes checked, each where it divides the suite's world size."""


class LongSequenceChecks(TrainBackendHooks[B]):
    """Tests of packed and sequence-parallel training; a base of ``TrainBackendSuite``."""

    def test_packed_training_matches_padded(self, pool: RankPool) -> None:
        diffs = pool.run(packed_training_matches_padded, type(self))
        print(f"packed at world {self.world_size}: max abs diff {max(diffs):.2e}")

    def test_sequence_parallel_matches_unsplit(self, pool: RankPool) -> None:
        sizes = [size for size in SEQUENCE_PARALLEL_SIZES if self.world_size % size == 0]
        if not sizes:
            pytest.skip(
                f"sequence parallelism needs 2 or more ranks, the suite has {self.world_size}"
            )
        for size in sizes:
            diffs = pool.run(sequence_parallel_matches_unsplit, type(self), size)
            print(f"groups of {size} at world {self.world_size}: max abs diff {max(diffs):.2e}")
