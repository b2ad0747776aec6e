"""``RolloutEngineSuite[E]``: the shared conformance tests of a ``RolloutEngine``.

A backend's test module is a short subclass that says how to build its engine and how to read
the engine's weights without the API under test (the backdoor)::

    class HFEngineSuite(RolloutEngineSuite[HFRolloutEngine]):
        @classmethod
        def make_engine(cls, model_dir: Path, device: torch.device) -> HFRolloutEngine:
            return HFRolloutEngine.from_pretrained(model_dir, config=HFEngineConfig(device=device))

        @classmethod
        def read_engine_weights(cls, engine: HFRolloutEngine) -> Mapping[str, torch.Tensor]:
            return dict(engine.model.named_parameters())

    class TestHFEngine(HFEngineSuite):
        world_size = 1

Every test runs on every rank of the class's pool, each rank with its own engine (built once per
worker and restored to a known state before each check; after a failed test every rank's engine
is shut down, so the next test starts afresh and fails, if it does, for its own reason). The
reference is independent of any engine: the plain transformers model of the same folder decoded
by hand (a full forward pass per token, argmax) and ``torch.log_softmax``. Optional behaviour is
gated by the capabilities the engine declares; a skip names the missing capability. Engines are
compared in fp32: build them in the folder's dtype (fp32).

Each test ``test_<what>`` runs the rank-side check ``check_<what>``, a module-level function
taking the suite class (registered by ``rollout_check``; ``lrft.testing.conformance._registry``).
They are served here by name, so they can also be called directly in one process:
``check_greedy_matches_reference(MySuite, models, torch.device("cpu"))`` with
``models = make_engine_models(folder)``; call ``shutdown_cached_engines()`` when done.
"""

from __future__ import annotations

from typing import Any

import pytest

# The check modules register their checks with ROLLOUT_CHECKS as they are imported.
from lrft.testing.conformance import (  # noqa: F401
    _rollout_cap_checks,
    _rollout_generation_checks,
    _rollout_in_place_checks,
    _rollout_load_checks,
    _rollout_logprob_path_checks,
    _rollout_media_checks,
    _rollout_media_sampling_checks,
    _rollout_sampling_checks,
    _rollout_turn_checks,
    _rollout_weight_checks,
    stateful,
)
from lrft.testing.conformance._registry import ROLLOUT_CHECKS, RegisteredCheck
from lrft.testing.conformance._rollout_common import (
    EngineModels,
    SuiteCheck,
    make_engine_models,
    shutdown_cached_engines,
)
from lrft.testing.conformance._rollout_hooks import E, RolloutEngineHooks
from lrft.testing.distributed import RankFailure, RankPool

__all__ = [
    "EngineModels",
    "RolloutEngineSuite",
    "SuiteCheck",
    *ROLLOUT_CHECKS.function_names(),
    "make_engine_models",
    "shutdown_cached_engines",
]


def __getattr__(name: str) -> SuiteCheck:
    """Every registered check, by its name (``check_greedy_matches_reference``, ...)."""
    check: SuiteCheck = ROLLOUT_CHECKS.lookup(name)
    return check


class RolloutEngineSuite(RolloutEngineHooks[E]):
    """Conformance tests every ``RolloutEngine`` must pass (see ``lrft.api.RolloutEngine``):
    one ``test_<what>`` per registered check ``check_<what>``."""

    @pytest.fixture(scope="class")
    @classmethod
    def engine_models(cls, tmp_path_factory: pytest.TempPathFactory) -> EngineModels:
        return make_engine_models(tmp_path_factory.mktemp("engine-models"), cls.model_heads)

    def run_check(self, pool: RankPool, check: SuiteCheck, models: EngineModels) -> None:
        """``check`` on every rank of ``pool``. After a failure every rank's cached engines are
        shut down (on every rank alike: a TP engine's shutdown may be collective), so that an
        engine a fault left broken cannot fail later tests in their set-up."""
        try:
            pool.run(check, type(self), models)
        except RankFailure as failure:
            if not pool.closed:
                try:
                    pool.run(shutdown_cached_engines)
                except RankFailure as cleanup:
                    failure.add_note(f"shutting the engines down afterwards failed too: {cleanup}")
            raise

    def run_registered(self, pool: RankPool, check: RegisteredCheck, *fixtures: Any) -> None:
        (models,) = fixtures
        self.run_check(pool, check.function, models)


ROLLOUT_CHECKS.add_tests(RolloutEngineSuite)
