"""The suite's per-request cap check has teeth: the hf engine with one defect each, ignoring
the caps or applying one to the whole call, fails ``check_request_caps``
(``test_hf_engine.py`` shows the intact engine passing it)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import ClassVar

import attrs
import pytest
import torch

from lrft.api import GenerationRequest, GenerationResult, SamplingParams
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.testing.conformance.rollout import (
    EngineModels,
    RolloutEngineSuite,
    check_request_caps,
    make_engine_models,
    shutdown_cached_engines,
)

CPU = torch.device("cpu")


class IgnoresRequestCaps(HFRolloutEngine):
    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        uncapped = [attrs.evolve(request, max_new_tokens=None) for request in requests]
        return super().generate(uncapped, params)


class CapsTheWholeCall(HFRolloutEngine):
    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        caps = [r.max_new_tokens for r in requests if r.max_new_tokens is not None]
        limit = min([params.max_new_tokens, *caps])
        return super().generate(requests, attrs.evolve(params, max_new_tokens=limit,
                                min_new_tokens=min(params.min_new_tokens, limit)))  # fmt: skip


class _Suite(RolloutEngineSuite[HFRolloutEngine]):
    engine_class: ClassVar[type[HFRolloutEngine]] = HFRolloutEngine

    @classmethod
    def make_engine(cls, model_dir: Path, device: torch.device) -> HFRolloutEngine:
        return cls.engine_class.from_pretrained(model_dir, config=HFEngineConfig(device=device))

    @classmethod
    def read_engine_weights(cls, engine: HFRolloutEngine) -> Mapping[str, torch.Tensor]:
        return dict(engine.model.named_parameters())


@pytest.fixture(scope="module")
def engine_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineModels]:
    yield make_engine_models(tmp_path_factory.mktemp("caps-teeth-models"))
    shutdown_cached_engines()


@pytest.mark.parametrize(
    ("engine_class", "message"),
    [
        (IgnoresRequestCaps, r"max_new_tokens=5 under SamplingParams.max_new_tokens=12"),
        (CapsTheWholeCall, r"max_new_tokens=None under SamplingParams.max_new_tokens=12"),
    ],
)
def test_request_caps_check_fails_broken_engine(
    engine_class: type[HFRolloutEngine], message: str, engine_models: EngineModels
) -> None:
    suite = type(f"{engine_class.__name__}Suite", (_Suite,), {"engine_class": engine_class})
    with pytest.raises(AssertionError, match=message):
        check_request_caps(suite, engine_models, CPU)
