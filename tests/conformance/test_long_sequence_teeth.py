"""The TrainBackend suite's packing and sequence-parallel checks catch broken backends.

The replica backend of ``test_train_suite_teeth`` (every rank holds the whole model and averages
gradients over all ranks), declaring packing and sequence parallelism, passes them. Each defect
below is what a backend's wrapping could do to a packed forward, put in as a hook on the
wrapped model: attention that crosses a packed row's boundaries, positions that restart one
token late (positions that merely run on across the row would be harmless to a rotary model,
whose attention sees only the distances within each sequence), a sequence-parallel group whose
second rank's share is lost. Each must fail its check with a message that says what differs.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import pytest
import torch
import torch.distributed as dist

from lrft.api import OptimizerConfig, SchedulerConfig, TrainCapabilities
from lrft.models.packed_attention import ROWS_KWARG, PackedRows
from lrft.testing.distributed import DistributedSuite, RankFailure, RankPool
from tests.conformance.test_train_suite_teeth import ReplicaBackend, ReplicaModel, _Replica

LongDefect = Literal["crosses_boundaries", "restarts_late", "loses_a_shard"] | None


def _one_sequence(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    rows = kwargs[ROWS_KWARG]
    kwargs[ROWS_KWARG] = PackedRows.of_lengths([rows.tokens], rows.cu_seqlens.device, rows.group)
    return args, kwargs


def _late_restarts(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    positions = kwargs["position_ids"].clone()
    for start in kwargs[ROWS_KWARG].bounds[1:-1]:
        positions[..., start] = positions[..., start - 1] + 1
    kwargs["position_ids"] = positions
    return args, kwargs


def _drop_second_share(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
) -> Any:
    group = kwargs[ROWS_KWARG].group
    if group is not None and dist.get_rank(group) == 1:
        output.logits = output.logits * 0.0
    return output


class LongReplicaBackend(ReplicaBackend):
    capabilities = TrainCapabilities(
        checkpoint_resharding=True, packed_sequences=True, sequence_parallel=True
    )

    def __init__(self, defect: LongDefect) -> None:
        super().__init__(None)
        self._long_defect = defect

    def prepare_trainable(
        self,
        model: torch.nn.Module,
        *,
        optimizer: OptimizerConfig,
        scheduler: SchedulerConfig | None = None,
    ) -> ReplicaModel:
        if self._long_defect == "crosses_boundaries":
            model.register_forward_pre_hook(_one_sequence, with_kwargs=True)
        elif self._long_defect == "restarts_late":
            model.register_forward_pre_hook(_late_restarts, with_kwargs=True)
        elif self._long_defect == "loses_a_shard":
            model.register_forward_hook(_drop_second_share, with_kwargs=True)
        return super().prepare_trainable(model, optimizer=optimizer, scheduler=scheduler)


class _LongReplica(_Replica):
    long_defect: ClassVar[LongDefect] = None

    @classmethod
    def make_backend(cls) -> LongReplicaBackend:
        return LongReplicaBackend(cls.long_defect)


class _CrossesBoundaries(_LongReplica):
    long_defect = "crosses_boundaries"


class _RestartsLate(_LongReplica):
    long_defect = "restarts_late"


class _LosesAShard(_LongReplica):
    long_defect = "loses_a_shard"


PACKED_DIFFER = (
    r"packed logprobs at step 0 differ from the padded forward of a plain copy of the model: "
    r"max abs diff \d\.\d+e[-+]\d\d"
)


class TestLongSequenceSuiteTeeth(DistributedSuite):
    world_size = 2

    def test_a_correct_backend_passes_and_an_undeclared_one_is_skipped(
        self, pool: RankPool
    ) -> None:
        _LongReplica().test_packed_training_matches_padded(pool)
        _LongReplica().test_sequence_parallel_matches_unsplit(pool)
        with pytest.raises(pytest.skip.Exception, match=r"requires capability 'packed_sequences'"):
            _Replica().test_packed_training_matches_padded(pool)

    @pytest.mark.parametrize(
        "suite", [_CrossesBoundaries, _RestartsLate], ids=["crosses-boundaries", "restarts-late"]
    )
    def test_packing_check_catches_a_row_that_is_not_kept_apart(
        self, pool: RankPool, suite: type[_LongReplica]
    ) -> None:
        with pytest.raises(RankFailure, match=PACKED_DIFFER):
            suite().test_packed_training_matches_padded(pool)

    def test_sequence_parallel_check_catches_a_lost_shard(self, pool: RankPool) -> None:
        _LosesAShard().test_packed_training_matches_padded(pool)  # unsplit, nothing is lost
        with pytest.raises(
            RankFailure,
            match=r"sequence-parallel \(groups of 2 at world 2\) logprobs at step 0 differ from "
            r"the padded forward",
        ):
            _LosesAShard().test_sequence_parallel_matches_unsplit(pool)
