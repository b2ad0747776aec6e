"""A hypothesis state machine over a ``RolloutEngine``'s lifecycle, checked against a reference.

Rules call ``generate``, ``sleep(level)``, ``wake(parts)`` and ``load_weights`` (complete or
partial, of two weight sets), and for engines that load in place the same loads written through
the storage their ``InPlaceWeightLoader`` lends, in any order; after every step the engine's state
and ``weights_digest`` are checked. A small reference model tracks what the contract says the
engine must be after each step: where its weights are, whether its KV cache is
resident, which weights it holds, its version, and whether it is stale. Every answer is compared
with it: greedy tokens with the reference decode of the held weights (precomputed), digests with
the digests of the held weights, errors with the errors the contract names. ``note()`` records
each step, so a failure prints the calls that reproduce it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

import attrs
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st
from hypothesis.errors import Flaky
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from lrft.api import (
    CapabilityNotSupported,
    EngineAsleepError,
    EngineCapabilities,
    EnginePart,
    EngineState,
    GenerationRequest,
    InPlaceWeightLoader,
    RolloutEngine,
    SamplingParams,
    StaleWeightsError,
    WeightsResidency,
)
from lrft.api.protocols import NamedTensors
from lrft.testing.conformance._rollout_common import (
    EngineModels,
    model_weights,
    rank_prompts,
    ready_engine,
    reference_digests,
    reference_greedy,
    rollout_check,
)

if TYPE_CHECKING:
    from lrft.testing.conformance._rollout_common import Suite

WEIGHTS, KV_CACHE = EnginePart.WEIGHTS, EnginePart.KV_CACHE
RESIDENT, PARKED, RELEASED = (
    WeightsResidency.RESIDENT,
    WeightsResidency.PARKED,
    WeightsResidency.RELEASED,
)


F = TypeVar("F", bound=Callable[..., None])


def _failed_anywhere(failed_here: bool) -> bool:
    """Whether this step failed on any rank of the default process group (this rank's answer
    where there is none). A machine that failed on one rank only would go on (hypothesis
    shrinks the failing run) calling collectives of a TP engine that the other ranks, done,
    never call: every rank's machine must fail at the same step, and then shrinks alike."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return failed_here
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    flag = torch.tensor([int(failed_here)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def _agreed(method: F) -> F:
    """A rule or invariant that fails on every rank when it fails on one."""

    @functools.wraps(method)
    def step(self: EngineLifecycleMachine, *args: Any, **kwargs: Any) -> None:
        try:
            method(self, *args, **kwargs)
        except Exception as error:
            self.failures.append(f"{type(error).__name__}: {error}")
            _failed_anywhere(True)
            raise
        if _failed_anywhere(False):
            raise AssertionError(
                f"{method.__name__} failed on another rank (its report says why): every rank's "
                "machine stops at that step, so that the ranks stay in step"
            )

    return cast(F, step)


@attrs.frozen(kw_only=True)
class LifecycleExpectations:
    """What the machine compares with, per weight set (``"base"`` and ``"other"``): the tensors
    to load, the reference greedy tokens of ``prompts`` and the digests cast to the engine's
    dtypes. The engine starts each run holding ``"base"``."""

    prompts: tuple[tuple[int, ...], ...]
    new_tokens: int
    weights: Mapping[str, NamedTensors]
    greedy: Mapping[str, Sequence[tuple[int, ...]]]
    digests: Mapping[str, Mapping[str, str]]


@attrs.define
class _Expected:
    """The contract's view of the engine. ``held`` is the weight set the engine holds, ``None``
    when its weights are undefined or a mix (then it must be stale)."""

    weights: WeightsResidency = RESIDENT
    kv_cache_resident: bool = True
    version: int | None = 0
    held: str | None = "base"
    needs_complete_update: bool = False

    def state(self) -> EngineState:
        level = 2 if self.weights is RELEASED else 0
        if level == 0 and (self.weights is PARKED or not self.kv_cache_resident):
            level = 1
        return EngineState(
            weights=self.weights,
            kv_cache_resident=self.kv_cache_resident,
            weights_version=self.version,
            sleep_level=level,
        )


class EngineLifecycleMachine(RuleBasedStateMachine):
    """Drive ``engine`` through random lifecycles; build one per run (see ``run_lifecycle``)."""

    def __init__(
        self,
        engine: RolloutEngine,
        expectations: LifecycleExpectations,
        declared: EngineCapabilities | None = None,
        failures: list[str] | None = None,
    ) -> None:
        super().__init__()
        self.engine = engine
        # every failure of a step, across runs: a report of a flaky search starts with the first
        self.failures = [] if failures is None else failures
        self.expect = expectations
        # What the engine declared when the search began: the rules it enables must not change
        # while hypothesis replays a sequence (an engine whose capabilities change fails the
        # invariant below instead).
        self.declared = engine.capabilities if declared is None else declared
        self.levels = self.declared.sleep_levels
        self.next_version = 100
        engine.wake()
        engine.load_weights(expectations.weights["base"], version=self.next_version)
        self.model = _Expected(version=self.next_version)
        note(f"start: awake, holding 'base' as version {self.next_version}")

    def _fails_with(self, error: type[Exception], call: Callable[[], object], doing: str) -> None:
        before = self.engine.state
        try:
            call()
        except error:
            pass
        else:
            raise AssertionError(f"{doing} in state {before} did not raise {error.__name__}")
        assert self.engine.state == before, (
            f"a call refused with {error.__name__} changed the state {before} -> "
            f"{self.engine.state}"
        )

    @rule()
    @_agreed
    def generate(self) -> None:
        note("generate(greedy)")
        model = self.model
        requests = [GenerationRequest(prompt_token_ids=p) for p in self.expect.prompts]
        params = SamplingParams(temperature=0.0, max_new_tokens=self.expect.new_tokens)
        if model.weights is not RESIDENT or not model.kv_cache_resident:
            self._fails_with(
                EngineAsleepError, lambda: self.engine.generate(requests, params), "generate()"
            )
        elif model.version is None:
            self._fails_with(
                StaleWeightsError, lambda: self.engine.generate(requests, params), "generate()"
            )
        else:
            assert model.held is not None, "internal: a fresh engine holds a known weight set"
            got = [r.output_token_ids for r in self.engine.generate(requests, params)]
            want = list(self.expect.greedy[model.held])
            assert got == want, (
                f"greedy tokens of the prompts {list(self.expect.prompts)}: the engine gave {got}, "
                f"the reference decode of the {model.held!r} weights it holds gives {want}"
            )

    @precondition(lambda self: bool(self.levels))
    @rule(level=st.sampled_from([1, 2]))
    @_agreed
    def sleep(self, level: int) -> None:
        note(f"sleep({level})")
        if level not in self.levels:
            self._fails_with(
                CapabilityNotSupported, lambda: self.engine.sleep(level), f"sleep({level})"
            )
            return
        self.engine.sleep(level)
        model = self.model
        model.kv_cache_resident = False
        if level == 2:
            model.weights, model.version, model.held = RELEASED, None, None
            model.needs_complete_update = True
        elif model.weights is RESIDENT:
            # Level 1 may keep the weights on the device or park them; both restore exactly.
            parked_or_kept = self.engine.state.weights
            assert parked_or_kept in (RESIDENT, PARKED), f"sleep(1) left weights {parked_or_kept}"
            model.weights = parked_or_kept

    @rule(parts=st.sampled_from([(WEIGHTS,), (KV_CACHE,), (WEIGHTS, KV_CACHE)]))
    @_agreed
    def wake(self, parts: Collection[EnginePart]) -> None:
        note(f"wake({[part.value for part in parts]})")
        model = self.model
        if WEIGHTS not in parts and KV_CACHE in parts and model.weights is not RESIDENT:
            self._fails_with(
                EngineAsleepError,
                lambda: self.engine.wake(parts),
                f"wake({[part.value for part in parts]})",
            )
            return
        self.engine.wake(parts)
        if WEIGHTS in parts:
            model.weights = RESIDENT  # from RELEASED: undefined memory, already stale
        if KV_CACHE in parts:
            model.kv_cache_resident = True

    @rule(which=st.sampled_from(["base", "other"]), complete=st.booleans())
    @_agreed
    def load_weights(self, which: str, complete: bool) -> None:
        self._load(which, complete, in_place=False)

    @precondition(lambda self: self.declared.loads_in_place)
    @rule(which=st.sampled_from(["base", "other"]), complete=st.booleans())
    @_agreed
    def load_in_place(self, which: str, complete: bool) -> None:
        self._load(which, complete, in_place=True)

    def _load(self, which: str, complete: bool, *, in_place: bool) -> None:
        model = self.model
        # A partial load re-sends half of the weights the engine holds (or, when they are
        # undefined, half of ``which``), so the outputs stay known.
        source = which if complete or model.held is None else model.held
        tensors = list(self.expect.weights[source])
        batch = tensors if complete else tensors[: len(tensors) // 2]
        self.next_version += 1
        version = self.next_version
        how = "written in place" if in_place else "load_weights"
        note(f"{how}({source!r}, {'all' if complete else 'half'}, v{version})")

        def load() -> None:
            if not in_place:
                self.engine.load_weights(batch, version=version)
                return
            with self.engine.weight_update(version) as loader:
                assert isinstance(loader, InPlaceWeightLoader), (
                    f"loads_in_place, but weight_update yields a {type(loader).__name__}"
                )
                targets = loader.targets([name for name, _ in batch])
                for target, (_, tensor) in zip(targets, batch, strict=True):
                    target.copy_(tensor)

        if model.weights is not RESIDENT:
            self._fails_with(EngineAsleepError, load, f"{how}({source!r})")
            return
        load()
        if complete:
            model.held, model.version, model.needs_complete_update = which, version, False
        elif not model.needs_complete_update:
            model.version = version

    @invariant()
    @_agreed
    def capabilities_stay_declared(self) -> None:
        assert self.engine.capabilities == self.declared, (
            f"the engine's capabilities changed from {self.declared} to "
            f"{self.engine.capabilities}: they are what it can do, not what state it is in"
        )

    @invariant()
    @_agreed
    def state_is_as_expected(self) -> None:
        want = self.model.state()
        assert self.engine.state == want, f"engine state {self.engine.state}, expected {want}"
        version = self.engine.weights_version
        assert version == want.weights_version, (
            f"weights_version is {version}, but state says {want.weights_version}"
        )

    @invariant()
    @_agreed
    def digest_is_of_the_held_weights(self) -> None:
        if self.model.weights is not RESIDENT:
            self._fails_with(EngineAsleepError, self.engine.weights_digest, "weights_digest()")
            return
        digest = self.engine.weights_digest()
        if self.model.held is not None:
            want = self.expect.digests[self.model.held]
            wrong = sorted(name for name in want if digest.get(name) != want[name])
            assert not wrong, f"digest differs from that of {self.model.held!r} for {wrong}"


def run_lifecycle(
    engine: RolloutEngine,
    expectations: LifecycleExpectations,
    *,
    max_examples: int = 40,
    steps: int = 12,
) -> None:
    """Run the machine on ``engine``; deterministic (derandomized) and without a database, so it
    behaves the same in every worker and leaves no files behind. 40 runs reach the sequences the
    teeth tests need (sleep(2), then waking the weights) with the in-place rule among the rules;
    12 no longer did (CPU: about 5 s for the hf engine, 8-21 s for vLLM, per suite class)."""
    budget = settings(
        max_examples=max_examples,
        stateful_step_count=steps,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )

    declared = engine.capabilities
    failures: list[str] = []

    class Machine(EngineLifecycleMachine):
        # hypothesis builds a fresh machine per run; the engine is shared and reset in __init__.
        def __init__(self) -> None:
            super().__init__(engine, expectations, declared, failures)

    try:
        run_state_machine_as_test(Machine, settings=budget)
    except Flaky as error:
        raise AssertionError(
            f"the {engine.name} engine answered the same steps differently when hypothesis "
            f"replayed them ({type(error).__name__}): what it does depends on something the "
            "steps do not set, which the machine cannot reproduce: state kept from earlier runs "
            "that wake() and a complete load_weights() do not reset (a cache, a call counter), "
            "randomness in what it reports, or capabilities that change. Its first failure: "
            f"{failures[0] if failures else '(none recorded)'}. Hypothesis's report: {error}"
        ) from error


@rollout_check
def check_lifecycle_state_machine(
    suite: Suite, models: EngineModels, rank: int, device: torch.device
) -> None:
    """The suite's rank-side entry: expectations from the reference decode, then the machine."""
    engine = ready_engine(suite, models, device)
    prompts = rank_prompts(rank)[:3]
    new_tokens = 6
    folders = {"base": models.base_dir, "other": models.other_dir}
    expectations = LifecycleExpectations(
        prompts=prompts,
        new_tokens=new_tokens,
        weights={label: list(model_weights(path).items()) for label, path in folders.items()},
        greedy={
            label: [reference_greedy(path, device, p, new_tokens)[0] for p in prompts]
            for label, path in folders.items()
        },
        digests={label: reference_digests(path, engine) for label, path in folders.items()},
    )
    run_lifecycle(
        engine, expectations, max_examples=suite.lifecycle_examples, steps=suite.lifecycle_steps
    )
