"""The engine suite's checks of the sampled path and of stop ids have teeth: each engine below is
the hf engine with one fault that an earlier suite passed, and must fail the check named with it,
with a message that says what is wrong. The checks run in this process (as rank 0 on the CPU);
``test_hf_engine.py`` shows the same checks pass on the intact engine."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import attrs
import pytest
import torch

from lrft.api import GenerationRequest, GenerationResult, SamplingParams
from lrft.backends.rollout.hf import HFRolloutEngine
from lrft.testing.conformance import rollout as checks
from lrft.testing.conformance.rollout import (
    EngineModels,
    SuiteCheck,
    make_engine_models,
    shutdown_cached_engines,
)
from lrft.testing.reference import token_logprobs
from tests.conformance.test_engine_suite_teeth import (
    BrokenEngineSuite,
    assert_check_fails,
    suite_of,
)

CPU = torch.device("cpu")


class HonoursFirstStopIdOnly(HFRolloutEngine):
    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        return super().generate(
            requests, attrs.evolve(params, stop_token_ids=params.stop_token_ids[:1])
        )


class SaysLengthAtTheLimit(HFRolloutEngine):
    """Reports ``length`` for an output that reached ``max_new_tokens`` on a stop id."""

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        return [
            attrs.evolve(r, finish_reason="length")
            if len(r.output_token_ids) == params.max_new_tokens
            else r
            for r in super().generate(requests, params)
        ]


class IgnoresStopsWhenSampling(HFRolloutEngine):
    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        if not params.greedy:
            params = attrs.evolve(params, stop_token_ids=(), min_new_tokens=0)
        return super().generate(requests, params)


class IgnoresMinNewTokensWhenSampling(HFRolloutEngine):
    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        if not params.greedy:
            params = attrs.evolve(params, min_new_tokens=0)
        return super().generate(requests, params)


class DropsTopPWithTopK(HFRolloutEngine):
    """Applies top-p only when top-k is off."""

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        if params.top_k > 0:
            params = attrs.evolve(params, top_p=1.0)
        return super().generate(requests, params)


class SamplesAtTemperatureOne(HFRolloutEngine):
    """Draws at temperature 1 whatever it is asked, but reports each drawn token's logprob under
    the temperature it was asked for: the logprobs of what it returns are right."""

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        if params.greedy:
            return super().generate(requests, params)
        drawn = super().generate(
            requests, attrs.evolve(params, temperature=1.0, return_logprobs=False)
        )
        if not params.return_logprobs:
            return drawn
        return [
            attrs.evolve(
                r,
                logprobs=tuple(
                    token_logprobs(
                        self.model, r.prompt_token_ids, r.output_token_ids, params.temperature
                    )
                ),
            )
            for r in drawn
        ]


class AnswersFromAnEarlierCall(HFRolloutEngine):
    """Hands back the first result of its previous call in place of this call's first."""

    _previous: list[GenerationResult] | None = None

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        results = super().generate(requests, params)
        previous, self._previous = self._previous, results
        return [previous[0], *results[1:]] if previous and results else results


class SortsTheCallersRequests(HFRolloutEngine):
    """Sorts the caller's list of requests by length, in place, and answers in that order."""

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        if isinstance(requests, list):
            requests.sort(key=lambda request: len(request.prompt_token_ids))
        return super().generate(requests, params)


class ClaimsTP2Suite(BrokenEngineSuite):
    tp_size = 2


CASES: list[tuple[type[HFRolloutEngine], SuiteCheck, str]] = [
    (
        HonoursFirstStopIdOnly,
        checks.check_stop_token_ids,
        r"stop_token_ids=\(\d+, \d+\), max_new_tokens=12: stop id \d+ first occurs at position",
    ),
    (
        SaysLengthAtTheLimit,
        checks.check_stop_token_ids,
        r"max_new_tokens=(\d+): stop id .* ends there with reason 'stop'; .*'length'",
    ),
    (
        IgnoresStopsWhenSampling,
        checks.check_sampled_stops_and_min_new_tokens,
        r"the output must end at its first stop id \(\d+ at position \d+\), with reason 'stop'",
    ),
    (
        IgnoresMinNewTokensWhenSampling,
        checks.check_sampled_stops_and_min_new_tokens,
        r"min_new_tokens=4, .* stop id \d+ at position [0-3] is within min_new_tokens",
    ),
    (
        DropsTopPWithTopK,
        checks.check_truncated_sampling_is_greedy,
        r"sampling with top_k=50, top_p=1e-06 keeps only the most likely token",
    ),
    (
        DropsTopPWithTopK,
        checks.check_samples_follow_the_distribution,
        r"more likely than it already hold probability 0\.\d+ .* outside the top_p=0.2 nucleus",
    ),
    (
        SamplesAtTemperatureOne,
        checks.check_samples_follow_the_distribution,
        r"640 tokens sampled at temperature 0.7: .* is -\d+\.\d standard errors from its "
        r"expectation .* flatter distribution, as at a higher temperature",
    ),
    (
        AnswersFromAnEarlierCall,
        checks.check_batch_independence,
        r"result 0 answers request 'r0' \(prompt .*\), which is not among the 1 requests of "
        r"this call",
    ),
    (
        SortsTheCallersRequests,
        checks.check_greedy_matches_reference,
        r"generate changed the caller's list of requests",
    ),
]


@pytest.fixture(scope="module")
def engine_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineModels]:
    yield make_engine_models(tmp_path_factory.mktemp("sampling-teeth-models"))
    shutdown_cached_engines()


@pytest.mark.parametrize(
    ("engine_class", "check", "message"),
    CASES,
    ids=[f"{cls.__name__}-{check.__name__}" for cls, check, _ in CASES],
)
def test_check_fails_broken_engine(
    engine_class: type[HFRolloutEngine],
    check: SuiteCheck,
    message: str,
    engine_models: EngineModels,
) -> None:
    assert_check_fails(engine_class, check, message, engine_models)


def test_right_logprobs_of_the_wrong_distribution_pass_the_logprob_check(
    engine_models: EngineModels,
) -> None:
    """Why the distribution check exists: the logprob check sees nothing wrong here."""
    checks.check_sampled_logprobs(suite_of(SamplesAtTemperatureOne), engine_models, CPU)


def test_tp_size_above_max_tp_fails_the_surface_check(engine_models: EngineModels) -> None:
    with pytest.raises(
        AssertionError,
        match=r"runs the hf engine in TP groups of 2 \(ClaimsTP2Suite\.tp_size\), but it "
        r"declares max_tp=1",
    ):
        checks.check_protocol_surface(ClaimsTP2Suite, engine_models, CPU)
