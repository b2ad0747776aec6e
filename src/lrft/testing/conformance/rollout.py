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
worker and restored to a known state before each check). The reference is independent of any
engine: the plain transformers model of the same folder decoded by hand (a full forward pass per
token, argmax) and ``torch.log_softmax``. Optional behaviour is gated by the capabilities the
engine declares; a skip names the missing capability. Engines are compared in fp32: build them in
the folder's dtype (fp32).

The checks are module-level functions taking the suite class, so they can also be called directly
in one process: ``check_greedy_matches_reference(MySuite, models, torch.device("cpu"))``.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar, Generic, TypeVar

import pytest
import torch

from lrft.api import RolloutEngine
from lrft.testing.conformance._rollout_cap_checks import check_request_caps
from lrft.testing.conformance._rollout_common import EngineModels, make_engine_models
from lrft.testing.conformance._rollout_generation_checks import (
    check_batch_independence,
    check_greedy_logprobs,
    check_greedy_matches_reference,
    check_max_new_tokens,
    check_min_new_tokens,
    check_multimodal_gated,
    check_n_samples,
    check_protocol_surface,
    check_sampled_logprobs,
    check_seed,
    check_stop_token_ids,
    check_truncated_sampling_is_greedy,
    check_uneven_requests,
)
from lrft.testing.conformance._rollout_in_place_checks import (
    check_in_place_capability_matches_loader,
    check_in_place_load_serves_what_was_written,
    check_in_place_loader_refuses_misuse,
    check_lending_counts_as_loading,
)
from lrft.testing.conformance._rollout_weight_checks import (
    check_asleep_refuses_work,
    check_bad_batch_changes_nothing,
    check_digest_matches_backdoor,
    check_kv_cache_waits_for_weights,
    check_level_1_restores_outputs,
    check_level_2_stale_until_loaded,
    check_level_outside_lrft,
    check_load_other_weights,
    check_shutdown,
    check_unsupported_level,
    check_weight_update_stream,
)
from lrft.testing.conformance.stateful import check_lifecycle_state_machine
from lrft.testing.distributed import DistributedSuite, RankPool

E = TypeVar("E", bound=RolloutEngine)

__all__ = ["EngineModels", "RolloutEngineSuite"]


class RolloutEngineSuite(DistributedSuite, abc.ABC, Generic[E]):
    """Conformance tests every ``RolloutEngine`` must pass (see ``lrft.api.RolloutEngine``)."""

    #: (attention heads, key/value heads) of the tiny test models (hidden size 64), for engines
    #: whose kernels need other shapes (vLLM's CPU attention needs head_dim >= 32: ``(2, 2)``)
    model_heads: ClassVar[tuple[int, int]] = (4, 2)

    @classmethod
    @abc.abstractmethod
    def make_engine(cls, model_dir: Path, device: torch.device) -> E:
        """An engine serving the Hugging Face folder ``model_dir`` on ``device`` (inside a rank).

        Called once per worker process; the suite reuses the engine across tests."""

    @classmethod
    @abc.abstractmethod
    def read_engine_weights(cls, engine: E) -> Mapping[str, torch.Tensor]:
        """Backdoor: every weight the engine holds, in Hugging Face names, read without its API
        (tied weights once)."""

    @pytest.fixture(scope="class")
    @classmethod
    def engine_models(cls, tmp_path_factory: pytest.TempPathFactory) -> EngineModels:
        return make_engine_models(tmp_path_factory.mktemp("engine-models"), cls.model_heads)

    # --- surface and generation ------------------------------------------------------------

    def test_satisfies_protocol(self, pool: RankPool, engine_models: EngineModels) -> None:
        pool.run(check_protocol_surface, type(self), engine_models)

    def test_greedy_matches_reference(self, pool: RankPool, engine_models: EngineModels) -> None:
        pool.run(check_greedy_matches_reference, type(self), engine_models)

    def test_greedy_logprobs_match_reference(
        self, pool: RankPool, engine_models: EngineModels
    ) -> None:
        pool.run(check_greedy_logprobs, type(self), engine_models)

    def test_sampled_logprobs_match_reference(
        self, pool: RankPool, engine_models: EngineModels
    ) -> None:
        pool.run(check_sampled_logprobs, type(self), engine_models)

    def test_max_new_tokens(self, pool: RankPool, engine_models: EngineModels) -> None:
        pool.run(check_max_new_tokens, type(self), engine_models)

    def test_stop_token_ids(self, pool: RankPool, engine_models: EngineModels) -> None:
        pool.run(check_stop_token_ids, type(self), engine_models)

    def test_min_new_tokens(self, pool: RankPool, engine_models: EngineModels) -> None:
        pool.run(check_min_new_tokens, type(self), engine_models)

    def test_n_samples_request_major(self, pool: RankPool, engine_models: EngineModels) -> None:
        pool.run(check_n_samples, type(self), engine_models)

    def test_top_k_1_and_tiny_top_p_are_greedy(
        self, pool: RankPool, engine_models: EngineModels
    ) -> None:
        pool.run(check_truncated_sampling_is_greedy, type(self), engine_models)

    def test_seed_reproduces_samples(self, pool: RankPool, engine_models: EngineModels) -> None:
        pool.run(check_seed, type(self), engine_models)

    def test_greedy_independent_of_batch(self, pool: RankPool, engine_models: EngineModels) -> None:
        pool.run(check_batch_independence, type(self), engine_models)

    def test_ranks_with_uneven_or_no_requests(
        self, pool: RankPool, engine_models: EngineModels
    ) -> None:
        pool.run(check_uneven_requests, type(self), engine_models)

    def test_multimodal_needs_capability(self, pool: RankPool, engine_models: EngineModels) -> None:
        pool.run(check_multimodal_gated, type(self), engine_models)

    def test_request_caps(self, pool: RankPool, engine_models: EngineModels) -> None:
        pool.run(check_request_caps, type(self), engine_models)

    # --- memory states ---------------------------------------------------------------------

    def test_asleep_refuses_generate_and_loads(
        self, pool: RankPool, engine_models: EngineModels
    ) -> None:
        pool.run(check_asleep_refuses_work, type(self), engine_models)

    def test_level_1_wake_restores_outputs(
        self, pool: RankPool, engine_models: EngineModels
    ) -> None:
        pool.run(check_level_1_restores_outputs, type(self), engine_models)

    def test_level_2_stale_until_loaded(self, pool: RankPool, engine_models: EngineModels) -> None:
        pool.run(check_level_2_stale_until_loaded, type(self), engine_models)

    def test_kv_cache_wakes_after_weights(
        self, pool: RankPool, engine_models: EngineModels
    ) -> None:
        pool.run(check_kv_cache_waits_for_weights, type(self), engine_models)

    def test_unsupported_sleep_level(self, pool: RankPool, engine_models: EngineModels) -> None:
        pool.run(check_unsupported_level, type(self), engine_models)

    def test_sleep_level_outside_lrft(self, pool: RankPool, engine_models: EngineModels) -> None:
        pool.run(check_level_outside_lrft, type(self), engine_models)

    def test_lifecycle_state_machine(self, pool: RankPool, engine_models: EngineModels) -> None:
        pool.run(check_lifecycle_state_machine, type(self), engine_models)

    # --- weights ---------------------------------------------------------------------------

    def test_load_other_weights(self, pool: RankPool, engine_models: EngineModels) -> None:
        pool.run(check_load_other_weights, type(self), engine_models)

    def test_bad_batch_changes_nothing(self, pool: RankPool, engine_models: EngineModels) -> None:
        pool.run(check_bad_batch_changes_nothing, type(self), engine_models)

    def test_weight_update_stream(self, pool: RankPool, engine_models: EngineModels) -> None:
        pool.run(check_weight_update_stream, type(self), engine_models)

    def test_digest_matches_backdoor(self, pool: RankPool, engine_models: EngineModels) -> None:
        pool.run(check_digest_matches_backdoor, type(self), engine_models)

    # --- loading in place (engines that declare loads_in_place) ----------------------------

    def test_in_place_capability_matches_loader(
        self, pool: RankPool, engine_models: EngineModels
    ) -> None:
        pool.run(check_in_place_capability_matches_loader, type(self), engine_models)

    def test_in_place_load_serves_what_was_written(
        self, pool: RankPool, engine_models: EngineModels
    ) -> None:
        pool.run(check_in_place_load_serves_what_was_written, type(self), engine_models)

    def test_lending_counts_as_loading(self, pool: RankPool, engine_models: EngineModels) -> None:
        pool.run(check_lending_counts_as_loading, type(self), engine_models)

    def test_in_place_loader_refuses_misuse(
        self, pool: RankPool, engine_models: EngineModels
    ) -> None:
        pool.run(check_in_place_loader_refuses_misuse, type(self), engine_models)

    def test_shutdown(self, pool: RankPool, engine_models: EngineModels) -> None:
        pool.run(check_shutdown, type(self), engine_models)
