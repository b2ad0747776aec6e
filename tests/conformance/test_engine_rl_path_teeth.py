"""The engine suite's checks of the paths reinforcement learning takes have teeth: each engine
below is the hf engine with one fault that the suite's other checks pass (they never ask for it
on that path), and must fail the check named with it, with a message naming the request, the
token, what was expected and what the engine did. ``test_hf_engine.py`` shows the same checks
pass on the intact engine; the last test here shows each fault slips past the older checks."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import pytest
import torch

from lrft.api import GenerationRequest, GenerationResult, SamplingParams
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.testing.conformance import rollout as checks
from lrft.testing.conformance.rollout import (
    EngineModels,
    SuiteCheck,
    make_engine_models,
    shutdown_cached_engines,
)
from lrft.testing.reference import token_distributions
from tests.conformance.test_engine_suite_teeth import assert_check_fails, suite_of

CPU = torch.device("cpu")


class RenormalisesMaskedLogprobs(HFRolloutEngine):
    """Reports, within ``min_new_tokens``, the logprob of the distribution renormalised after
    masking the stop ids (what it sampled from), not the unmasked one."""

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        results = super().generate(requests, params)
        if not params.return_logprobs or not params.stop_token_ids:
            return results
        temperature = 1.0 if params.greedy else params.temperature
        fixed = []
        for result in results:
            assert result.logprobs is not None
            rows = token_distributions(
                self.model, result.prompt_token_ids, result.output_token_ids, temperature
            )
            masked = rows.clone()
            masked[:, list(params.stop_token_ids)] = float("-inf")
            renormalised = masked.log_softmax(-1)
            logprobs = [
                float(renormalised[j, token]) if j < params.min_new_tokens else value
                for j, (token, value) in enumerate(
                    zip(result.output_token_ids, result.logprobs, strict=True)
                )
            ]
            fixed.append(attrs.evolve(result, logprobs=tuple(logprobs)))
        return fixed


class GoesOnAfterStopWithLogprobs(HFRolloutEngine):
    """On the logprobs path, keeps decoding after a stop id up to the limit (its logprobs
    buffer is sized to the limit and nothing cuts the row)."""

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        results = super().generate(requests, params)
        if not params.return_logprobs:
            return results
        longer = []
        for index, result in enumerate(results):
            limit = requests[index // params.n].capped(params).max_new_tokens
            left = limit - len(result.output_token_ids)
            if result.finish_reason != "stop" or left <= 0:
                longer.append(result)
                continue
            context = (*result.prompt_token_ids, *result.output_token_ids)
            more = attrs.evolve(params, n=1, stop_token_ids=(), min_new_tokens=0,
                                max_new_tokens=left)  # fmt: skip
            [tail] = super().generate([GenerationRequest(prompt_token_ids=context)], more)
            assert result.logprobs is not None
            assert tail.logprobs is not None
            longer.append(
                attrs.evolve(
                    result,
                    output_token_ids=result.output_token_ids + tail.output_token_ids,
                    logprobs=result.logprobs + tail.logprobs,
                    finish_reason="length",
                )
            )
        return longer


class DropsCapsWithLogprobs(HFRolloutEngine):
    """Applies the requests' own caps except when logprobs are asked for."""

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        if params.return_logprobs:
            requests = [attrs.evolve(r, max_new_tokens=None) for r in requests]
        return super().generate(requests, params)


class StopsAtTheModelsEos(HFRolloutEngine):
    """Adds the EOS ids its model's config declares to the stop ids, as a generate with the
    model's own generation config would."""

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        model: Any = self.model  # a transformers model, with its config
        eos = model.config.eos_token_id
        declared = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        return super().generate(
            requests, attrs.evolve(params, stop_token_ids=(*params.stop_token_ids, *declared))
        )


class SeedsUnseededCallsAlike(HFRolloutEngine):
    """Treats a missing seed as seed 0, so every unseeded call draws the same stream."""

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        if params.seed is None:
            params = attrs.evolve(params, seed=0)
        return super().generate(requests, params)


class ForgetsItsOwnOutput(HFRolloutEngine):
    """Keeps a request id's prompt (its prefix cache) and continues a later turn under that id
    from it plus the turn's new tokens after its own output: the output never enters the
    context, as when only the prompt's KV cache was kept."""

    def __init__(self, model: torch.nn.Module, *, config: HFEngineConfig | None = None) -> None:
        super().__init__(model, config=config)
        self._seen: dict[str, tuple[tuple[int, ...], int]] = {}

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        served = []
        for request in requests:
            prompt = request.prompt_token_ids
            known = self._seen.get(request.request_id)
            if known is not None and prompt[: len(known[0])] == known[0]:
                kept, output = known
                prompt = kept + prompt[len(kept) + output :]
            served.append(attrs.evolve(request, prompt_token_ids=prompt))
        results = super().generate(served, params)
        for request, result in zip(requests, results[:: params.n], strict=True):
            self._seen[request.request_id] = (
                request.prompt_token_ids,
                len(result.output_token_ids),
            )
        return [
            attrs.evolve(r, prompt_token_ids=requests[i // params.n].prompt_token_ids)
            for i, r in enumerate(results)
        ]


class DropsImagesWhenSampling(HFRolloutEngine):
    """Samples without the images (its sampled path was written for text), greedy with them."""

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        if params.greedy:
            return super().generate(requests, params)
        return super().generate(_blanked(requests, "pixel_values"), params)


class DropsAudioWhenSampling(HFRolloutEngine):
    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        if params.greedy:
            return super().generate(requests, params)
        return super().generate(_blanked(requests, "input_features"), params)


def _blanked(requests: Sequence[GenerationRequest], name: str) -> list[GenerationRequest]:
    from tests.conformance.test_engine_media_teeth import _blanked as blanked

    return blanked(requests, name)


class CachesResultsByPrompt(HFRolloutEngine):
    """Caches results by (prompt ids, parameters), blind to the media: an image of one size
    gives the same expanded prompt ids as another."""

    def __init__(self, model: torch.nn.Module, *, config: HFEngineConfig | None = None) -> None:
        super().__init__(model, config=config)
        self._cache: dict[Any, list[GenerationResult]] = {}

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        key = (tuple(r.prompt_token_ids for r in requests), params)
        if key not in self._cache:
            self._cache[key] = super().generate(requests, params)
        return list(self._cache[key])


class SplitsMediaByTheWrongRows(HFRolloutEngine):
    """Decodes in chunks of 2 rows but hands each chunk the media of its rows in reverse."""

    def __init__(self, model: torch.nn.Module, *, config: HFEngineConfig | None = None) -> None:
        chunks = attrs.evolve(config or HFEngineConfig(), max_batch_size=2)
        super().__init__(model, config=chunks)

    def _generate_chunk(self, prompts: Any, limits: Any, params: Any, media: Any) -> Any:
        return super()._generate_chunk(prompts, limits, params, list(media)[::-1])


class KeepsWeightsAtSleep2FromAwake(HFRolloutEngine):
    """Releases its weights at level 2 only when deepening level 1; ``sleep(2)`` from awake
    keeps them and their version, as a level 1 would."""

    def sleep(self, level: int) -> None:
        if level == 2 and self.state.sleep_level == 0:
            level = 1
        super().sleep(level)


class CountsItsCalls(HFRolloutEngine):
    """Answers its sixth generate call ever with the tokens reversed: a fault that depends on
    how often it was called, which no reset of its state undoes."""

    calls = 0

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        results = super().generate(requests, params)
        type(self).calls += 1
        if type(self).calls != 6:
            return results
        return [attrs.evolve(r, output_token_ids=r.output_token_ids[::-1]) for r in results]


class ForgetsInPlaceAfterDeepSleep(HFRolloutEngine):
    """Stops declaring loads_in_place once it slept at level 2."""

    _deep = False

    def sleep(self, level: int) -> None:
        self._deep = self._deep or level == 2
        super().sleep(level)

    @property
    def capabilities(self) -> Any:
        declared = super().capabilities
        return attrs.evolve(declared, loads_in_place=False) if self._deep else declared


CASES: list[tuple[type[HFRolloutEngine], SuiteCheck, str]] = [
    (
        RenormalisesMaskedLogprobs,
        checks.check_logprobs_with_stops_and_caps,
        r"greedy with return_logprobs, the request's cap None: request 'r0' sample 0: token 0 "
        r"\(id \d+\) of .* has logprob -\d\.\d+, the reference log_softmax\(logits / 1\) of the "
        r"unmasked distribution gives -\d\.\d+ .* renormalised over the ids left after masking "
        r"the \d+ stop ids",
    ),
    (
        GoesOnAfterStopWithLogprobs,
        checks.check_logprobs_with_stops_and_caps,
        r"request 'r\d' sample 0 \(prompt .*\) gave .*: the output must end at its first stop "
        r"id \(\d+ at position \d+\), with reason 'stop'; the engine went on for \d+ more tokens",
    ),
    (
        DropsCapsWithLogprobs,
        checks.check_logprobs_with_stops_and_caps,
        r"the request's cap 2 with \d+ stop ids, min_new_tokens=2, max_new_tokens=2: request "
        r"'r1' sample 0 .* \d+ tokens, above the 2 allowed",
    ),
    (
        StopsAtTheModelsEos,
        checks.check_no_stop_tokens_of_its_own,
        r"request 'r\d' sample 0 \(prompt .*\) gave .* \('stop'\): with no stop ids every output "
        r"runs to max_new_tokens=12 with reason 'length'; it ended at the model's EOS id \d+",
    ),
    (
        SeedsUnseededCallsAlike,
        checks.check_unseeded_sampling,
        r"two unseeded calls of the same 3 requests \(n=2, temperature 1\) drew the same samples",
    ),
    (
        ForgetsItsOwnOutput,
        checks.check_multi_turn_continuation,
        r"turn 1 of request 'conversation0' \(a context of \d+ tokens: its prompt, then the "
        r"engine's outputs and the observations of 1 turns; cap 5\): the engine gave .*, the "
        r"reference decode of the whole context gives",
    ),
    (
        DropsImagesWhenSampling,
        checks.check_image_sampled_logprobs,
        r"sampled \(T=0\.8, top_k=40, seed 17\): request 'm0' \(1 image\(s\)\) sample 0, "
        r"against the reference with the request's pixel_values .* \(an engine that samples "
        r"without the images differs here\): token \d+ has logprob",
    ),
    (
        DropsAudioWhenSampling,
        checks.check_audio_sampled_logprobs,
        r"request 'm0' \(1 audio clip\(s\)\) sample 0, against the reference with the "
        r"request's input_features .* \(an engine that samples without the audio differs "
        r"here\): token \d+ has logprob",
    ),
    (
        CachesResultsByPrompt,
        checks.check_images_change_the_output,
        r"request 'm0' \(1 image\(s\)\): asked again with another image .* the engine gave the "
        r"first image's output .* again, where the reference gives .*: it answered from "
        r"something cached for the earlier call",
    ),
    (
        SplitsMediaByTheWrongRows,
        checks.check_image_batch_independence,
        r"generate\(\) of a batch of \d+ requests with media \(request 'm\d' \(\d image\(s\)\), .*"
        r"raised RuntimeError: The expanded size of the tensor .*: the media tensors given to "
        r"the model do not fit the prompts given with them; an engine that splits a batch into "
        r"chunks must give each chunk exactly its own rows' media",
    ),
    (
        KeepsWeightsAtSleep2FromAwake,
        checks.check_level_2_stale_until_loaded,
        r"after sleep\(2\) from awake: .*, not weights released at level 2 and stale",
    ),
    (
        CountsItsCalls,
        checks.check_lifecycle_state_machine,
        r"(?s)the hf engine answered the same steps differently when hypothesis replayed them "
        r"\(Flaky\w*\).* Its first failure: AssertionError: greedy tokens of the "
        r"prompts .*: the engine gave .*, the reference decode of the '(base|other)' weights",
    ),
    (
        ForgetsInPlaceAfterDeepSleep,
        checks.check_lifecycle_state_machine,
        r"(?s)answered the same steps differently .* Its first failure: AssertionError: the "
        r"engine's capabilities changed from EngineCapabilities\(.*loads_in_place=True\) to "
        r"EngineCapabilities\(.*loads_in_place=False\)",
    ),
]

#: the checks of the same behaviour the suite had before these: each fault passes them
OLDER_CHECKS: dict[type[HFRolloutEngine], SuiteCheck] = {
    RenormalisesMaskedLogprobs: checks.check_sampled_logprobs,
    GoesOnAfterStopWithLogprobs: checks.check_sampled_stops_and_min_new_tokens,
    DropsCapsWithLogprobs: checks.check_request_caps,
    SeedsUnseededCallsAlike: checks.check_seed,
    ForgetsItsOwnOutput: checks.check_greedy_matches_reference,
    DropsImagesWhenSampling: checks.check_image_greedy_matches_reference,
    DropsAudioWhenSampling: checks.check_audio_greedy_matches_reference,
}


@pytest.fixture(scope="module")
def engine_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineModels]:
    yield make_engine_models(tmp_path_factory.mktemp("rl-path-teeth-models"))
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
    CountsItsCalls.calls = 0
    assert_check_fails(engine_class, check, message, engine_models)


def test_each_fault_passes_the_older_checks(engine_models: EngineModels) -> None:
    """Why the checks above exist: the suite's checks of the same behaviour before them (which
    never ask for it on the path RL takes) see nothing wrong."""
    for engine_class, check in OLDER_CHECKS.items():
        check(suite_of(engine_class), engine_models, CPU)


def test_audio_failures_do_not_speak_of_m_rope(engine_models: EngineModels) -> None:
    from tests.conformance.test_engine_media_teeth import DropsAudio

    with pytest.raises(AssertionError) as failure:
        checks.check_audio_greedy_matches_reference(suite_of(DropsAudio), engine_models, CPU)
    assert "m-RoPE" not in str(failure.value)
    assert "input_features and feature_attention_mask" in str(failure.value)
