"""Responses of forced, ragged lengths: what rollouts look like once a model ends its answers.

A random-weight model never emits its end-of-sequence token, so every response of a benchmark
runs to ``generate_max_len`` and every row of a batch ends at the same step. The ragged variant
(a workload's ``grpo.ragged``) forces each response's length instead: the ``k``-th response of
the ``c``-th generate call is :func:`forced_lengths`'s ``k``-th length for call ``c``, drawn
log-uniformly between ``min_tokens`` and ``max_tokens`` (many short responses, a long tail). The
lengths depend only on the seed, the call and the position, so another trainer (TRL, with a
logits processor that forces EOS there: ``scripts/trl_w2_ragged.py``) can be given the same
lengths step by step.

lrft forces them through the engine's own per-request caps (``GenerationRequest
.max_new_tokens``): :class:`ForcedLengths` wraps the trainer's engine and gives each response its
own request with its own cap. The ideal a ragged rollout is measured against is the same number
of tokens generated at the full batch's rate: ``sum(lengths) / (rows * max_len)`` uniform
full-length rollouts.
"""

from __future__ import annotations

import random
import time
from collections.abc import Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import attrs

from lrft.api.capabilities import EngineCapabilities
from lrft.api.protocols import NamedTensors, RolloutEngine, WeightLoader
from lrft.api.types import (
    EnginePart,
    EngineState,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    TensorSpec,
)
from lrft.bench.ceilings import synchronize
from lrft.bench.workloads import RaggedSpec

if TYPE_CHECKING:
    from lrft.trainer import RLTrainer


def forced_lengths(spec: RaggedSpec, call: int, count: int) -> list[int]:
    """The lengths of the ``count`` responses of generate call ``call`` (0-based)."""
    draw = random.Random(f"lrft-ragged/{spec.seed}/{call}")
    ratio = spec.max_tokens / spec.min_tokens
    return [
        min(spec.max_tokens, round(spec.min_tokens * ratio ** draw.random())) for _ in range(count)
    ]


class ForcedLengths:
    """A ``RolloutEngine`` that generates through ``engine`` with each response's length forced
    (see module doc); every other call goes to ``engine`` as it is. ``lengths`` records each
    call's forced lengths, ``generated`` the lengths its responses have (shorter where one ended
    at a stop id first: a random model's rare end-of-sequence token)."""

    def __init__(self, engine: RolloutEngine, spec: RaggedSpec) -> None:
        self.engine = engine
        self.spec = spec
        self.lengths: list[list[int]] = []
        self.generated: list[list[int]] = []

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        n = params.n
        lengths = forced_lengths(self.spec, len(self.lengths), len(requests) * n)
        self.lengths.append(lengths)
        # One request per response, each capped at its own length (caps are per request).
        expanded = [
            attrs.evolve(request, max_new_tokens=lengths[index * n + sample])
            for index, request in enumerate(requests)
            for sample in range(n)
        ]
        results = self.engine.generate(expanded, attrs.evolve(params, n=1))
        self.generated.append([len(result.output_token_ids) for result in results])
        return [
            attrs.evolve(result, request_id=requests[k // n].request_id, sample_index=k % n)
            for k, result in enumerate(results)
        ]

    # --- everything else is the engine's -----------------------------------------------------

    @property
    def name(self) -> str:
        return self.engine.name

    @property
    def capabilities(self) -> EngineCapabilities:
        return self.engine.capabilities

    @property
    def state(self) -> EngineState:
        return self.engine.state

    @property
    def weights_version(self) -> int | None:
        return self.engine.weights_version

    def sleep(self, level: int) -> None:
        self.engine.sleep(level)

    def wake(
        self, parts: Collection[EnginePart] = (EnginePart.WEIGHTS, EnginePart.KV_CACHE)
    ) -> None:
        self.engine.wake(parts)

    def parameter_specs(self) -> Mapping[str, TensorSpec]:
        return self.engine.parameter_specs()

    def load_weights(self, named_tensors: NamedTensors, *, version: int) -> None:
        self.engine.load_weights(named_tensors, version=version)

    def weight_update(self, version: int) -> AbstractContextManager[WeightLoader]:
        return self.engine.weight_update(version)

    def weights_digest(self) -> dict[str, str]:
        return self.engine.weights_digest()

    def shutdown(self) -> None:
        self.engine.shutdown()

    def __enter__(self) -> ForcedLengths:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()


def full_batch_tokens_per_s(trainer: RLTrainer, forced: ForcedLengths) -> float:
    """Generated tokens per second of the trainer's rollout with no length forced (every
    response ``generate_max_len`` long): the full batch's rate. The second of two calls, so
    that graphs the ragged steps did not need are captured outside the timed one."""
    maker = trainer.maker
    params = attrs.evolve(maker.sampling, seed=0)
    prompts = trainer.train_data.select(trainer.sampler.next_batch().indices)
    maker.engine = forced.engine
    try:
        for _ in range(2):
            synchronize(trainer.device)
            began = time.perf_counter()
            # level 1 at most: level 2 would leave the second call stale weights
            results = trainer.colocation.rollout(
                lambda: maker.generate(prompts, params), sleep_level=1
            )
            synchronize(trainer.device)
            seconds = time.perf_counter() - began
    finally:
        maker.engine = forced
    return sum(len(result.output_token_ids) for result in results) / seconds
