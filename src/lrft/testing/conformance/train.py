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

Each test ``test_<what>`` runs the check ``check_<what>`` (registered with ``TRAIN_CHECKS``;
``lrft.testing.conformance._registry``), served here by name (``check_training_matches_reference``,
...): each takes the suite class and runs on every rank of any harness that has initialised the
default process group, except ``check_checkpoint_loads_at_another_world_size``, which runs in
the test process with the pool. The names they had before they took the ``check_`` prefix
(``training_matches_reference``, ...) still work for one release.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# The check modules register their checks with TRAIN_CHECKS as they are imported.
from lrft.testing.conformance import (  # noqa: F401
    _train_lora_ranks,
    _train_ranks,
    _train_schedule_ranks,
)
from lrft.testing.conformance._registry import TRAIN_CHECKS, RegisteredCheck
from lrft.testing.conformance._train_hooks import B
from lrft.testing.conformance._train_ranks import accumulation_matches_one_batch
from lrft.testing.conformance._train_schedule_ranks import (
    resume_at_another_world_size,
    save_for_resharding,
)
from lrft.testing.conformance.train_long import LongSequenceChecks
from lrft.testing.distributed import RankPool

__all__ = [
    "TrainBackendSuite",
    "accumulation_matches_one_batch",
    *TRAIN_CHECKS.function_names(),
    "resume_at_another_world_size",
    "save_for_resharding",
]

#: the checks' names before they took the ``check_`` prefix, kept for one release
RENAMED = {
    "satisfies_protocols": "check_satisfies_protocols",
    "training_matches_reference": "check_training_matches_reference",
    "schedules_match_reference": "check_every_schedule_kind_past_warm_up",
    "unclipped_training_matches_reference": "check_training_without_clipping_matches_reference",
    "non_finite_gradient_skips_step": "check_non_finite_gradient_skips_step",
    "full_weights_complete_exact_bucketed": "check_full_weights_are_complete_exact_and_bucketed",
    "offload_reload_parameters": "check_offload_reload_parameters",
    "offload_reload_optimizer": "check_offload_reload_optimizer",
    "offload_reload_gradients": "check_offload_reload_gradients",
    "offload_everything_mid_accumulation": "check_offload_everything_mid_accumulation",
    "undeclared_offload_raises": "check_undeclared_offload_raises",
    "save_load_resumes_bit_exactly": "check_save_load_resumes_bit_exactly",
    "frozen_matches_plain_model": "check_frozen_model_matches_plain_model",
    "frozen_offload_reload": "check_frozen_offload_reload",
    "lora_trains_adapters_only": "check_lora_model_trains_its_adapters_only",
    "varying_weights_are_what_training_changes": "check_varying_weights_are_what_training_changes",
}


def __getattr__(name: str) -> Callable[..., Any]:
    """Every registered check, by its name (``check_training_matches_reference``, ...) or by the
    name it had before (``RENAMED``)."""
    return TRAIN_CHECKS.lookup(name, RENAMED)


class TrainBackendSuite(LongSequenceChecks[B]):
    """Conformance tests of a ``TrainBackend``; subclass it once per backend and world size. One
    ``test_<what>`` per registered check ``check_<what>``."""

    def run_check(self, pool: RankPool, check: Callable[..., Any]) -> list[Any]:
        """``check(suite class)`` on every rank of ``pool``; a parity figure it returns (the
        largest difference from the reference) is printed."""
        results = pool.run(check, type(self))
        if results and all(isinstance(result, float) for result in results):
            what = check.__name__.removeprefix("check_")
            print(f"{what} at world {len(results)}: max abs diff {max(results):.2e}")
        return results

    def run_registered(self, pool: RankPool, check: RegisteredCheck, *fixtures: Any) -> None:
        del fixtures  # the train checks take none
        if check.in_parent:
            check.function(type(self), pool)
        else:
            self.run_check(pool, check.function)


TRAIN_CHECKS.add_tests(TrainBackendSuite)
