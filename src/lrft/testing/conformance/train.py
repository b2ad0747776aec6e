"""``TrainBackendSuite[B]``: the conformance suite every ``TrainBackend`` must pass.

A backend's test module is a short subclass: it says how to build the backend on a rank and how
to read the backend's state through a backdoor that bypasses the API under test::

    class TestMyBackendWorld2(TrainBackendSuite[MyBackend]):
        world_size = 2

        @classmethod
        def make_backend(cls) -> MyBackend:
            return MyBackend(MyConfig())

        @classmethod
        def parameter_shards(cls, model: FrozenModel) -> dict[str, torch.Tensor]: ...
        @classmethod
        def optimizer_state(cls, model: TrainableModel) -> dict[str, torch.Tensor]: ...
        @classmethod
        def gathered_parameters(cls, model: FrozenModel) -> dict[str, torch.Tensor]: ...

Every test runs its body on all ranks of the harness's pool (``RankPool.run``). The reference is
a plain single-process copy of the model trained inside each rank on the whole batch, while the
backend trains on each rank's equal share. Optional behaviour is gated by the backend's declared
capabilities; a test that needs one the backend does not declare is skipped with a reason that
names it. ``make_backend`` must build a backend that computes in fp32 (the suite compares with an
fp32 reference at 1e-5).

The rank-side bodies are exported here (``training_matches_reference``, ...): each takes the suite
class and runs on every rank of any harness that has initialised the default process group.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lrft.testing.conformance._train_hooks import B
from lrft.testing.conformance._train_lora_ranks import (
    lora_trains_adapters_only,
    varying_weights_are_what_training_changes,
)
from lrft.testing.conformance._train_ranks import (
    accumulation_matches_one_batch,
    frozen_matches_plain_model,
    frozen_offload_reload,
    full_weights_complete_exact_bucketed,
    non_finite_gradient_skips_step,
    offload_everything_mid_accumulation,
    offload_reload_gradients,
    offload_reload_optimizer,
    offload_reload_parameters,
    satisfies_protocols,
    save_load_resumes_bit_exactly,
    training_matches_reference,
    undeclared_offload_raises,
)
from lrft.testing.conformance._train_schedule_ranks import (
    resume_at_another_world_size,
    save_for_resharding,
    schedules_match_reference,
    unclipped_training_matches_reference,
)
from lrft.testing.conformance.train_long import LongSequenceChecks
from lrft.testing.distributed import RankPool, missing_devices, shared_pool

__all__ = [
    "TrainBackendSuite",
    "accumulation_matches_one_batch",
    "frozen_matches_plain_model",
    "frozen_offload_reload",
    "full_weights_complete_exact_bucketed",
    "lora_trains_adapters_only",
    "non_finite_gradient_skips_step",
    "offload_everything_mid_accumulation",
    "offload_reload_gradients",
    "offload_reload_optimizer",
    "offload_reload_parameters",
    "resume_at_another_world_size",
    "satisfies_protocols",
    "save_for_resharding",
    "save_load_resumes_bit_exactly",
    "schedules_match_reference",
    "training_matches_reference",
    "unclipped_training_matches_reference",
    "undeclared_offload_raises",
    "varying_weights_are_what_training_changes",
]


class TrainBackendSuite(LongSequenceChecks[B]):
    """Conformance tests of a ``TrainBackend``; subclass it once per backend and world size."""

    # --- the tests ------------------------------------------------------------------------------

    def test_satisfies_protocols(self, pool: RankPool) -> None:
        pool.run(satisfies_protocols, type(self))

    def test_training_matches_reference(self, pool: RankPool) -> None:
        diffs = pool.run(training_matches_reference, type(self), steps=3)
        print(f"parity after 3 steps at world {len(diffs)}: max abs diff {max(diffs):.2e}")

    def test_accumulated_micro_batches_match_one_batch(self, pool: RankPool) -> None:
        diffs = pool.run(accumulation_matches_one_batch, type(self), micro_batches=2)
        print(f"2 micro-batches at world {len(diffs)}: max abs diff {max(diffs):.2e}")

    def test_deferred_gradient_sync_matches_one_batch(self, pool: RankPool) -> None:
        diffs = pool.run(
            accumulation_matches_one_batch, type(self), micro_batches=3, defer_sync=True
        )
        print(f"3 micro-batches, sync deferred, at world {len(diffs)}: max abs {max(diffs):.2e}")

    def test_every_schedule_kind_past_warm_up(self, pool: RankPool) -> None:
        diffs = pool.run(schedules_match_reference, type(self))
        print(f"3 schedules at world {len(diffs)}: max abs diff {max(diffs):.2e}")

    def test_training_without_clipping_matches_reference(self, pool: RankPool) -> None:
        diffs = pool.run(unclipped_training_matches_reference, type(self))
        print(f"unclipped at world {len(diffs)}: max abs diff {max(diffs):.2e}")

    def test_non_finite_gradient_skips_step(self, pool: RankPool) -> None:
        diffs = pool.run(non_finite_gradient_skips_step, type(self))
        print(f"after a skipped step at world {len(diffs)}: max abs diff {max(diffs):.2e}")

    def test_full_weights_are_complete_exact_and_bucketed(self, pool: RankPool) -> None:
        pool.run(full_weights_complete_exact_bucketed, type(self))

    def test_offload_reload_parameters(self, pool: RankPool) -> None:
        pool.run(offload_reload_parameters, type(self))

    def test_offload_reload_optimizer(self, pool: RankPool) -> None:
        pool.run(offload_reload_optimizer, type(self))

    def test_offload_reload_gradients(self, pool: RankPool) -> None:
        pool.run(offload_reload_gradients, type(self))

    def test_offload_everything_mid_accumulation(self, pool: RankPool) -> None:
        pool.run(offload_everything_mid_accumulation, type(self))

    def test_undeclared_offload_raises(self, pool: RankPool) -> None:
        pool.run(undeclared_offload_raises, type(self))

    def test_save_load_resumes_bit_exactly(self, pool: RankPool) -> None:
        pool.run(save_load_resumes_bit_exactly, type(self))

    def test_checkpoint_loads_at_another_world_size(self, pool: RankPool, tmp_path: Path) -> None:
        other = self.resharding_world_size or (2 if self.world_size == 1 else 1)
        if (missing := missing_devices(other, self.device_type)) is not None:
            pytest.skip(f"loading at world {other} {missing}")
        pool.run(save_for_resharding, type(self), tmp_path)
        diffs = shared_pool(other, self.device_type).run(
            resume_at_another_world_size, type(self), tmp_path, self.world_size
        )
        print(f"saved at world {self.world_size}, resumed at {other}: max abs {max(diffs):.2e}")

    def test_frozen_model_matches_plain_model(self, pool: RankPool) -> None:
        pool.run(frozen_matches_plain_model, type(self))

    def test_frozen_offload_reload(self, pool: RankPool) -> None:
        pool.run(frozen_offload_reload, type(self))

    def test_lora_model_trains_its_adapters_only(self, pool: RankPool) -> None:
        pool.run(lora_trains_adapters_only, type(self))

    def test_varying_weights_are_what_training_changes(self, pool: RankPool) -> None:
        pool.run(varying_weights_are_what_training_changes, type(self))
