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

The checks are module-level functions taking the suite class, exported here, so they can also
be called directly in one process: ``check_greedy_matches_reference(MySuite, models,
torch.device("cpu"))`` with ``models = make_engine_models(folder)``; call
``shutdown_cached_engines()`` when done.
"""

from __future__ import annotations

import pytest

from lrft.testing.conformance._rollout_cap_checks import check_request_caps
from lrft.testing.conformance._rollout_common import (
    EngineModels,
    SuiteCheck,
    make_engine_models,
    shutdown_cached_engines,
)
from lrft.testing.conformance._rollout_generation_checks import (
    check_batch_independence,
    check_greedy_logprobs,
    check_greedy_matches_reference,
    check_max_new_tokens,
    check_media_gated,
    check_min_new_tokens,
    check_protocol_surface,
    check_stop_token_ids,
    check_uneven_requests,
)
from lrft.testing.conformance._rollout_hooks import E, RolloutEngineHooks
from lrft.testing.conformance._rollout_in_place_checks import (
    check_in_place_capability_matches_loader,
    check_in_place_load_serves_what_was_written,
    check_in_place_loader_refuses_misuse,
    check_lending_counts_as_loading,
)
from lrft.testing.conformance._rollout_load_checks import (
    check_bad_batch_changes_nothing,
    check_load_other_weights,
    check_load_tied_weights,
    check_outputs_follow_every_load,
    check_weight_update_stream,
)
from lrft.testing.conformance._rollout_media_checks import (
    check_audio_batch_independence,
    check_audio_changes_the_output,
    check_audio_greedy_matches_reference,
    check_audio_outputs_survive_the_lifecycle,
    check_image_batch_independence,
    check_image_greedy_matches_reference,
    check_image_outputs_survive_the_lifecycle,
    check_images_change_the_output,
)
from lrft.testing.conformance._rollout_sampling_checks import (
    check_n_samples,
    check_sampled_logprobs,
    check_sampled_stops_and_min_new_tokens,
    check_samples_follow_the_distribution,
    check_seed,
    check_truncated_sampling_is_greedy,
)
from lrft.testing.conformance._rollout_weight_checks import (
    check_asleep_refuses_work,
    check_digest_matches_backdoor,
    check_kv_cache_waits_for_weights,
    check_level_1_restores_outputs,
    check_level_2_stale_until_loaded,
    check_level_outside_lrft,
    check_shutdown,
    check_unsupported_level,
)
from lrft.testing.conformance.stateful import check_lifecycle_state_machine
from lrft.testing.distributed import RankFailure, RankPool

__all__ = [
    "EngineModels",
    "RolloutEngineSuite",
    "SuiteCheck",
    "check_asleep_refuses_work",
    "check_audio_batch_independence",
    "check_audio_changes_the_output",
    "check_audio_greedy_matches_reference",
    "check_audio_outputs_survive_the_lifecycle",
    "check_bad_batch_changes_nothing",
    "check_batch_independence",
    "check_digest_matches_backdoor",
    "check_greedy_logprobs",
    "check_greedy_matches_reference",
    "check_image_batch_independence",
    "check_image_greedy_matches_reference",
    "check_image_outputs_survive_the_lifecycle",
    "check_images_change_the_output",
    "check_in_place_capability_matches_loader",
    "check_in_place_load_serves_what_was_written",
    "check_in_place_loader_refuses_misuse",
    "check_kv_cache_waits_for_weights",
    "check_lending_counts_as_loading",
    "check_level_1_restores_outputs",
    "check_level_2_stale_until_loaded",
    "check_level_outside_lrft",
    "check_lifecycle_state_machine",
    "check_load_other_weights",
    "check_load_tied_weights",
    "check_max_new_tokens",
    "check_media_gated",
    "check_min_new_tokens",
    "check_n_samples",
    "check_outputs_follow_every_load",
    "check_protocol_surface",
    "check_request_caps",
    "check_sampled_logprobs",
    "check_sampled_stops_and_min_new_tokens",
    "check_samples_follow_the_distribution",
    "check_seed",
    "check_shutdown",
    "check_stop_token_ids",
    "check_truncated_sampling_is_greedy",
    "check_uneven_requests",
    "check_unsupported_level",
    "check_weight_update_stream",
    "make_engine_models",
    "shutdown_cached_engines",
]


class RolloutEngineSuite(RolloutEngineHooks[E]):
    """Conformance tests every ``RolloutEngine`` must pass (see ``lrft.api.RolloutEngine``)."""

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

    # --- surface and generation ------------------------------------------------------------

    def test_satisfies_protocol(self, pool: RankPool, engine_models: EngineModels) -> None:
        self.run_check(pool, check_protocol_surface, engine_models)

    def test_greedy_matches_reference(self, pool: RankPool, engine_models: EngineModels) -> None:
        self.run_check(pool, check_greedy_matches_reference, engine_models)

    def test_greedy_logprobs_match_reference(
        self, pool: RankPool, engine_models: EngineModels
    ) -> None:
        self.run_check(pool, check_greedy_logprobs, engine_models)

    def test_sampled_logprobs_match_reference(
        self, pool: RankPool, engine_models: EngineModels
    ) -> None:
        self.run_check(pool, check_sampled_logprobs, engine_models)

    def test_max_new_tokens(self, pool: RankPool, engine_models: EngineModels) -> None:
        self.run_check(pool, check_max_new_tokens, engine_models)

    def test_stop_token_ids(self, pool: RankPool, engine_models: EngineModels) -> None:
        self.run_check(pool, check_stop_token_ids, engine_models)

    def test_min_new_tokens(self, pool: RankPool, engine_models: EngineModels) -> None:
        self.run_check(pool, check_min_new_tokens, engine_models)

    def test_sampled_stops_and_min_new_tokens(
        self, pool: RankPool, engine_models: EngineModels
    ) -> None:
        self.run_check(pool, check_sampled_stops_and_min_new_tokens, engine_models)

    def test_n_samples_request_major(self, pool: RankPool, engine_models: EngineModels) -> None:
        self.run_check(pool, check_n_samples, engine_models)

    def test_top_k_1_and_tiny_top_p_are_greedy(
        self, pool: RankPool, engine_models: EngineModels
    ) -> None:
        self.run_check(pool, check_truncated_sampling_is_greedy, engine_models)

    def test_samples_follow_the_distribution(
        self, pool: RankPool, engine_models: EngineModels
    ) -> None:
        self.run_check(pool, check_samples_follow_the_distribution, engine_models)

    def test_seed_reproduces_samples(self, pool: RankPool, engine_models: EngineModels) -> None:
        self.run_check(pool, check_seed, engine_models)

    def test_greedy_independent_of_batch(self, pool: RankPool, engine_models: EngineModels) -> None:
        self.run_check(pool, check_batch_independence, engine_models)

    def test_ranks_with_uneven_or_no_requests(
        self, pool: RankPool, engine_models: EngineModels
    ) -> None:
        self.run_check(pool, check_uneven_requests, engine_models)

    def test_media_need_capability(self, pool: RankPool, engine_models: EngineModels) -> None:
        self.run_check(pool, check_media_gated, engine_models)

    def test_request_caps(self, pool: RankPool, engine_models: EngineModels) -> None:
        self.run_check(pool, check_request_caps, engine_models)

    # --- media (engines that declare images) ------------------------------------------------

    def test_image_greedy_matches_reference(
        self, pool: RankPool, engine_models: EngineModels
    ) -> None:
        self.run_check(pool, check_image_greedy_matches_reference, engine_models)

    def test_images_change_the_output(self, pool: RankPool, engine_models: EngineModels) -> None:
        self.run_check(pool, check_images_change_the_output, engine_models)

    def test_image_batch_independence(self, pool: RankPool, engine_models: EngineModels) -> None:
        self.run_check(pool, check_image_batch_independence, engine_models)

    def test_image_outputs_survive_the_lifecycle(
        self, pool: RankPool, engine_models: EngineModels
    ) -> None:
        self.run_check(pool, check_image_outputs_survive_the_lifecycle, engine_models)

    # --- media (engines that declare audio) -------------------------------------------------

    def test_audio_greedy_matches_reference(
        self, pool: RankPool, engine_models: EngineModels
    ) -> None:
        self.run_check(pool, check_audio_greedy_matches_reference, engine_models)

    def test_audio_changes_the_output(self, pool: RankPool, engine_models: EngineModels) -> None:
        self.run_check(pool, check_audio_changes_the_output, engine_models)

    def test_audio_batch_independence(self, pool: RankPool, engine_models: EngineModels) -> None:
        self.run_check(pool, check_audio_batch_independence, engine_models)

    def test_audio_outputs_survive_the_lifecycle(
        self, pool: RankPool, engine_models: EngineModels
    ) -> None:
        self.run_check(pool, check_audio_outputs_survive_the_lifecycle, engine_models)

    # --- memory states ---------------------------------------------------------------------

    def test_asleep_refuses_generate_and_loads(
        self, pool: RankPool, engine_models: EngineModels
    ) -> None:
        self.run_check(pool, check_asleep_refuses_work, engine_models)

    def test_level_1_wake_restores_outputs(
        self, pool: RankPool, engine_models: EngineModels
    ) -> None:
        self.run_check(pool, check_level_1_restores_outputs, engine_models)

    def test_level_2_stale_until_loaded(self, pool: RankPool, engine_models: EngineModels) -> None:
        self.run_check(pool, check_level_2_stale_until_loaded, engine_models)

    def test_kv_cache_wakes_after_weights(
        self, pool: RankPool, engine_models: EngineModels
    ) -> None:
        self.run_check(pool, check_kv_cache_waits_for_weights, engine_models)

    def test_unsupported_sleep_level(self, pool: RankPool, engine_models: EngineModels) -> None:
        self.run_check(pool, check_unsupported_level, engine_models)

    def test_sleep_level_outside_lrft(self, pool: RankPool, engine_models: EngineModels) -> None:
        self.run_check(pool, check_level_outside_lrft, engine_models)

    def test_lifecycle_state_machine(self, pool: RankPool, engine_models: EngineModels) -> None:
        self.run_check(pool, check_lifecycle_state_machine, engine_models)

    # --- weights ---------------------------------------------------------------------------

    def test_load_other_weights(self, pool: RankPool, engine_models: EngineModels) -> None:
        self.run_check(pool, check_load_other_weights, engine_models)

    def test_bad_batch_changes_nothing(self, pool: RankPool, engine_models: EngineModels) -> None:
        self.run_check(pool, check_bad_batch_changes_nothing, engine_models)

    def test_weight_update_stream(self, pool: RankPool, engine_models: EngineModels) -> None:
        self.run_check(pool, check_weight_update_stream, engine_models)

    def test_outputs_follow_every_load(self, pool: RankPool, engine_models: EngineModels) -> None:
        self.run_check(pool, check_outputs_follow_every_load, engine_models)

    def test_digest_matches_backdoor(self, pool: RankPool, engine_models: EngineModels) -> None:
        self.run_check(pool, check_digest_matches_backdoor, engine_models)

    # --- loading in place (engines that declare loads_in_place) ----------------------------

    def test_in_place_capability_matches_loader(
        self, pool: RankPool, engine_models: EngineModels
    ) -> None:
        self.run_check(pool, check_in_place_capability_matches_loader, engine_models)

    def test_in_place_load_serves_what_was_written(
        self, pool: RankPool, engine_models: EngineModels
    ) -> None:
        self.run_check(pool, check_in_place_load_serves_what_was_written, engine_models)

    def test_lending_counts_as_loading(self, pool: RankPool, engine_models: EngineModels) -> None:
        self.run_check(pool, check_lending_counts_as_loading, engine_models)

    def test_in_place_loader_refuses_misuse(
        self, pool: RankPool, engine_models: EngineModels
    ) -> None:
        self.run_check(pool, check_in_place_loader_refuses_misuse, engine_models)

    def test_shutdown(self, pool: RankPool, engine_models: EngineModels) -> None:
        self.run_check(pool, check_shutdown, engine_models)

    # Last: it builds an engine of its own (the tied model), and an engine that allows one
    # instance per process then has to rebuild the suite's cached one for any later test.
    def test_tied_embeddings_follow_a_load(
        self, pool: RankPool, engine_models: EngineModels
    ) -> None:
        self.run_check(pool, check_load_tied_weights, engine_models)
