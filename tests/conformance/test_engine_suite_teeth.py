"""The engine suite has teeth: engines with one realistic bug each fail the suite's checks.

Each broken engine is the hf engine with a single defect. The checks are the suite's own
rank-side functions, called in this process (an ``AssertionError`` with a readable message) or
through a pool (a ``RankFailure`` naming the rank). ``test_hf_engine.py`` shows the same checks
pass on the intact engine, so each failure here is the defect's doing.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import ClassVar

import attrs
import pytest
import torch

from lrft.api import (
    EnginePart,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    WeightLoadError,
    WeightsResidency,
)
from lrft.api.protocols import NamedTensors
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.testing.conformance import rollout as checks
from lrft.testing.conformance.rollout import (
    EngineModels,
    RolloutEngineSuite,
    SuiteCheck,
    make_engine_models,
    shutdown_cached_engines,
)
from lrft.testing.distributed import RankFailure, shared_pool

CPU = torch.device("cpu")


# --- broken engines -----------------------------------------------------------------------------


class DropsLastTensor(HFRolloutEngine):
    """Silently skips the last tensor of every load, yet reports the new version."""

    def load_weights(self, named_tensors: NamedTensors, *, version: int) -> None:
        super().load_weights(named_tensors[:-1], version=version)


class ReversesResults(HFRolloutEngine):
    """Returns the right completions in the wrong order."""

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        return super().generate(requests, params)[::-1]


class DropsStopToken(HFRolloutEngine):
    """Stops at the right place but leaves the stop token out of the output."""

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        results = super().generate(requests, params)
        return [
            attrs.evolve(r, output_token_ids=r.output_token_ids[:-1], logprobs=None)
            if r.finish_reason == "stop"
            else r
            for r in results
        ]


class IgnoresSeed(HFRolloutEngine):
    """Seeds each call afresh (leaving the caller's RNG alone) instead of with ``params.seed``."""

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        return super().generate(requests, attrs.evolve(params, seed=random.randrange(2**31)))


class IgnoresTruncation(HFRolloutEngine):
    """Samples from the whole distribution whatever top_k and top_p say."""

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        return super().generate(requests, attrs.evolve(params, top_k=0, top_p=1.0))


class IgnoresMinNewTokens(HFRolloutEngine):
    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        return super().generate(requests, attrs.evolve(params, min_new_tokens=0))


class SlightlyOffLogprobs(HFRolloutEngine):
    """Logprobs off by 1e-4, the size of error a bf16 log-softmax would make."""

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        results = super().generate(requests, params)
        return [
            attrs.evolve(r, logprobs=tuple(x + 1e-4 for x in r.logprobs))
            if r.logprobs is not None
            else r
            for r in results
        ]


class CopiesBeforeValidating(HFRolloutEngine):
    """Copies a batch tensor by tensor and only notices a bad name when it reaches it."""

    def load_weights(self, named_tensors: NamedTensors, *, version: int) -> None:
        known = self.parameter_specs()
        with torch.no_grad():
            for name, tensor in named_tensors:
                if name not in known or tuple(tensor.shape) != known[name].shape:
                    raise WeightLoadError(f"bad weight {name!r}")
                dict(self.model.named_parameters())[name].copy_(tensor)
        super().load_weights(named_tensors, version=version)


class ForgetsStaleness(HFRolloutEngine):
    """After waking from level 2 it reports its old version, serving whatever memory holds."""

    _version_before_sleep: int | None = None

    def sleep(self, level: int) -> None:
        if self.state.sleep_level == 0:
            self._version_before_sleep = self.weights_version
        super().sleep(level)

    def wake(
        self, parts: Collection[EnginePart] = (EnginePart.WEIGHTS, EnginePart.KV_CACHE)
    ) -> None:
        released = self.state.weights is WeightsResidency.RELEASED
        super().wake(parts)
        if released and self.state.weights is WeightsResidency.RESIDENT:
            self._lifecycle._version = self._version_before_sleep  # the bug: no longer stale


# --- suites around them (not collected: the names do not start with "Test") ---------------------


class BrokenEngineSuite(RolloutEngineSuite[HFRolloutEngine]):
    engine_class: ClassVar[type[HFRolloutEngine]] = HFRolloutEngine

    @classmethod
    def make_engine(cls, model_dir: Path, device: torch.device) -> HFRolloutEngine:
        return cls.engine_class.from_pretrained(model_dir, config=HFEngineConfig(device=device))

    @classmethod
    def read_engine_weights(cls, engine: HFRolloutEngine) -> Mapping[str, torch.Tensor]:
        return dict(engine.model.named_parameters())


def suite_of(engine_class: type[HFRolloutEngine]) -> type[BrokenEngineSuite]:
    return type(
        f"{engine_class.__name__}Suite", (BrokenEngineSuite,), {"engine_class": engine_class}
    )


def assert_check_fails(
    engine_class: type[HFRolloutEngine], check: SuiteCheck, message: str, models: EngineModels
) -> None:
    """``check`` of the suite around ``engine_class`` fails with an error matching ``message``."""
    with pytest.raises(AssertionError, match=message):
        check(suite_of(engine_class), models, CPU)


class DropsLastTensorSuite(BrokenEngineSuite):
    engine_class = DropsLastTensor  # module-level: a pool's workers import it by name


CASES: list[tuple[type[HFRolloutEngine], SuiteCheck, str]] = [
    (
        DropsLastTensor,
        checks.check_load_other_weights,
        r"engine's 'model\.norm\.weight' is not the loaded",
    ),
    (ReversesResults, checks.check_greedy_matches_reference, "must be request-major"),
    (ReversesResults, checks.check_n_samples, "must be request-major"),
    (DropsStopToken, checks.check_stop_token_ids, "stop id .* first occurs at position"),
    (DropsStopToken, checks.check_min_new_tokens, "the output must be just it"),
    (IgnoresSeed, checks.check_seed, "the same seed gave different samples"),
    (IgnoresTruncation, checks.check_truncated_sampling_is_greedy, "must equal greedy"),
    (IgnoresMinNewTokens, checks.check_min_new_tokens, "emitted within min_new_tokens=4"),
    (SlightlyOffLogprobs, checks.check_greedy_logprobs, r"tolerance 1e-05"),
    (SlightlyOffLogprobs, checks.check_sampled_logprobs, r"tolerance 1e-05"),
    (
        CopiesBeforeValidating,
        checks.check_bad_batch_changes_nothing,
        r"weights_digest\(\) after load_weights\(\) of a batch whose "
        r"'model\.layers\.0\.mlp\.no_such_weight' is an unknown name: \d+ of 27 tensor digests "
        r"differ",
    ),
    (ForgetsStaleness, checks.check_level_2_stale_until_loaded, "fresh after waking from level 2"),
    (ForgetsStaleness, checks.check_lifecycle_state_machine, r"engine state .*expected"),
]


@pytest.fixture(scope="module")
def engine_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineModels]:
    yield make_engine_models(tmp_path_factory.mktemp("teeth-models"))
    shutdown_cached_engines()


@pytest.mark.parametrize(
    ("engine_class", "check", "message"),
    CASES,
    ids=[f"{cls.__name__}-{check.__name__}" for cls, check, _ in CASES],
)
def test_suite_check_fails_broken_engine(
    engine_class: type[HFRolloutEngine],
    check: SuiteCheck,
    message: str,
    engine_models: EngineModels,
) -> None:
    assert_check_fails(engine_class, check, message, engine_models)


def test_failure_in_a_rank_names_the_rank_and_the_tensor(engine_models: EngineModels) -> None:
    pool = shared_pool(2)
    with pytest.raises(
        RankFailure,
        match=r"(?s)failed on 2 of 2 ranks.*rank 0 raised AssertionError.*model\.norm\.weight",
    ):
        pool.run(checks.check_load_other_weights, DropsLastTensorSuite, engine_models)
