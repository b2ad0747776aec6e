"""The media checks have teeth: engines with one realistic media bug each fail them, readably.

Each broken engine is the hf engine with a single defect: it drops the images or the audio
(feeds the encoder blank pixels or silent mel features of the right shape), places the tokens by
plain 1-D positions instead of Qwen2-VL's 3-D m-RoPE, or swaps the media of two requests whose
media have one shape. ``test_hf_engine.py`` shows the same checks pass on the intact engine.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import ClassVar
from unittest import mock

import attrs
import pytest
import torch

from lrft.api import GenerationRequest, GenerationResult, MediaInputs, SamplingParams
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.testing.conformance import rollout as checks
from lrft.testing.conformance.rollout import (
    EngineModels,
    RolloutEngineSuite,
    SuiteCheck,
    make_engine_models,
    shutdown_cached_engines,
)

CPU = torch.device("cpu")


def _with_tensors(
    request: GenerationRequest, tensors: Mapping[str, torch.Tensor]
) -> GenerationRequest:
    assert request.media is not None
    assert request.media.processed is not None
    processed = attrs.evolve(request.media.processed, tensors=tensors)
    return attrs.evolve(request, media=MediaInputs(processed=processed))


def _blanked(requests: Sequence[GenerationRequest], name: str) -> list[GenerationRequest]:
    """``requests`` with their media tensor ``name`` zeroed (other tensors as they are)."""
    return [
        r
        if r.media is None or r.media.processed is None
        else _with_tensors(
            r,
            {
                key: torch.zeros_like(t) if key == name else t
                for key, t in r.media.processed.tensors.items()
            },
        )
        for r in requests
    ]


class DropsImages(HFRolloutEngine):
    """Hands the model blank pixels in the shape of the real ones."""

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        return super().generate(_blanked(requests, "pixel_values"), params)


class DropsAudio(HFRolloutEngine):
    """Hands the model silent (all-zero) mel features in the shape of the real ones."""

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        return super().generate(_blanked(requests, "input_features"), params)


class OneDimensionalPositions(HFRolloutEngine):
    """The static loop with plain 1-D positions: no m-RoPE grid for image tokens, no delta."""

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        with mock.patch("lrft.backends.rollout._hf_decode.rope_positions", return_value=None):
            return super().generate(requests, params)


def _tensors(request: GenerationRequest) -> Mapping[str, torch.Tensor] | None:
    if request.media is None or request.media.processed is None:
        return None
    return request.media.processed.tensors


def _swapped(requests: Sequence[GenerationRequest], name: str) -> list[GenerationRequest]:
    """The first two requests whose media tensor ``name`` has one shape get each other's
    media tensors."""
    shapes = [None if (t := _tensors(r)) is None else tuple(t[name].shape) for r in requests]
    swapped = list(requests)
    with_media = [i for i, shape in enumerate(shapes) if shape is not None]
    pair = next(
        ((i, j) for i in with_media for j in with_media if i < j and shapes[i] == shapes[j]), None
    )
    if pair is not None:
        i, j = pair
        first, second = _tensors(requests[i]), _tensors(requests[j])
        assert first is not None
        assert second is not None
        swapped[i] = _with_tensors(requests[i], second)
        swapped[j] = _with_tensors(requests[j], first)
    return swapped


class SwapsImages(HFRolloutEngine):
    """Gives the first two requests whose images have one shape each other's images."""

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        return super().generate(_swapped(requests, "pixel_values"), params)


class SwapsAudio(HFRolloutEngine):
    """Gives the first two requests whose clips have one shape each other's clips."""

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        return super().generate(_swapped(requests, "feature_attention_mask"), params)


class BrokenEngineSuite(RolloutEngineSuite[HFRolloutEngine]):
    engine_class: ClassVar[type[HFRolloutEngine]] = HFRolloutEngine
    decode: ClassVar[str] = "auto"

    @classmethod
    def make_engine(cls, model_dir: Path, device: torch.device) -> HFRolloutEngine:
        config = HFEngineConfig(device=device, decode=cls.decode)
        return cls.engine_class.from_pretrained(model_dir, config=config)

    @classmethod
    def read_engine_weights(cls, engine: HFRolloutEngine) -> Mapping[str, torch.Tensor]:
        return dict(engine.model.named_parameters())


def _suite(engine_class: type[HFRolloutEngine]) -> type[BrokenEngineSuite]:
    decode = "static" if engine_class is OneDimensionalPositions else "auto"
    return type(
        f"{engine_class.__name__}Suite",
        (BrokenEngineSuite,),
        {"engine_class": engine_class, "decode": decode},
    )


CASES: list[tuple[type[HFRolloutEngine], SuiteCheck, str]] = [
    (
        DropsImages,
        checks.check_images_change_the_output,
        "two different images gave the same output",
    ),
    (
        DropsImages,
        checks.check_image_greedy_matches_reference,
        r"request 'm0' \(1 image\(s\)\): the engine gave",
    ),
    (
        OneDimensionalPositions,
        checks.check_image_greedy_matches_reference,
        r"request 'm0' \(1 image\(s\)\): the engine gave .* 3-D m-RoPE",
    ),
    (
        SwapsImages,
        checks.check_image_greedy_matches_reference,
        r"request 'm0' \(1 image\(s\)\): the engine gave",
    ),
    (
        SwapsImages,
        checks.check_image_batch_independence,
        r"in reverse order: request 'm3' .* mixes up the requests' images",
    ),
    (
        DropsAudio,
        checks.check_audio_changes_the_output,
        "two different audio clips gave the same output",
    ),
    (
        DropsAudio,
        checks.check_audio_greedy_matches_reference,
        r"request 'm0' \(1 audio clip\(s\)\): the engine gave .* drops the audio features",
    ),
    (
        SwapsAudio,
        checks.check_audio_greedy_matches_reference,
        r"request 'm0' \(1 audio clip\(s\)\): the engine gave",
    ),
    (
        SwapsAudio,
        checks.check_audio_batch_independence,
        r"in reverse order: request 'm3' .* mixes up the requests' clips",
    ),
]


@pytest.fixture(scope="module")
def engine_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineModels]:
    yield make_engine_models(tmp_path_factory.mktemp("media-teeth-models"))
    shutdown_cached_engines()


@pytest.mark.parametrize(
    ("engine_class", "check", "message"),
    CASES,
    ids=[f"{cls.__name__}-{check.__name__}" for cls, check, _ in CASES],
)
def test_media_check_fails_broken_engine(
    engine_class: type[HFRolloutEngine],
    check: SuiteCheck,
    message: str,
    engine_models: EngineModels,
) -> None:
    with pytest.raises(AssertionError, match=message):
        check(_suite(engine_class), engine_models, CPU)


def test_intact_engine_passes_the_same_checks(engine_models: EngineModels) -> None:
    for check in {check for _, check, _ in CASES}:
        check(_suite(HFRolloutEngine), engine_models, CPU)
    static = type("StaticSuite", (BrokenEngineSuite,), {"decode": "static"})
    checks.check_image_greedy_matches_reference(static, engine_models, CPU)
    checks.check_audio_greedy_matches_reference(static, engine_models, CPU)


def test_the_hf_engine_declares_the_modalities_its_model_takes(
    engine_models: EngineModels,
) -> None:
    """Without these the media checks would skip the hf engine rather than run on it."""
    declared = {
        folder.name: {"images", "audio"}
        & set(
            HFRolloutEngine.from_pretrained(
                folder, config=HFEngineConfig(device=CPU)
            ).capabilities.names()
        )
        for folder in (engine_models.base_dir, engine_models.vlm_dir, engine_models.audio_dir)
    }
    assert declared == {
        engine_models.base_dir.name: set(),
        engine_models.vlm_dir.name: {"images"},
        engine_models.audio_dir.name: {"audio"},
    }
