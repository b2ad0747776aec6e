"""Responses that end where rollouts end: at an end-of-sequence token the sampler draws.

A random-weight model almost never emits its end-of-sequence token, so every response of a
benchmark runs to ``generate_max_len`` and every row of a batch ends at the same step. The
ragged variant (a workload's ``grpo.ragged``) makes the responses end at lengths of a long-tailed
law instead, log-uniform between ``min_tokens`` and ``max_tokens`` (many short answers, a few
long ones), and it does so inside the model's sampling, as a model that answers would:

- :class:`EndDraw` is a forward hook on the generating model. At every step of every row it
  decides from what the forward already holds (the token just fed and its position) whether the
  next token must be EOS, and if so leaves EOS the only token with a finite logit. The decision
  is ``u < hazard[j]``: ``j`` is the index of the token about to be sampled, ``hazard[j]`` the
  law's probability of ending at ``j`` given that the response got there, and
  ``u = frac(U[token] + W[j])`` with tables ``U`` (per vocabulary id) and ``W`` (per index)
  drawn once from the seed. Since the token fed is the engine's own random draw, ``u`` is a
  fresh uniform variate at each step and the lengths follow the law.
- Nothing knows a length beforehand: the engine samples EOS like any token and learns that a
  row ended the way it learns it in training (the ``hf`` engine's static loop reads its rows'
  stop flags every few steps), and the decision costs a few device kernels per step, no host
  synchronisation, so CUDA graphs capture it.
- The same hook on the same law serves TRL's side (``scripts/trl_grpo.py``, around its
  ``generate`` and continuous-batching calls): both sides draw their lengths from one law by one
  rule. The lengths of two runs are draws, not the same numbers, so each side reports the
  tokens it generated.

The ideal a ragged rollout is measured against is the same number of tokens generated at the
full batch's rate (:func:`full_batch_tokens_per_s`: the rollout with the hook switched off).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import attrs
import torch

from lrft.api.capabilities import EngineCapabilities
from lrft.api.errors import LrftError
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


def length_law(spec: RaggedSpec) -> list[float]:
    """``P(length = l)`` for ``l`` in ``0..max_tokens``: ``round(min * (max / min) ** V)`` with
    ``V`` uniform on [0, 1) (the probability of each rounding interval of the log-uniform
    variable, clipped to the bounds)."""
    low, high = spec.min_tokens, spec.max_tokens
    law = [0.0] * (high + 1)
    if low == high:
        law[high] = 1.0
        return law
    scale = math.log(high / low)
    for length in range(low, high + 1):
        upper, lower = min(length + 0.5, high), max(length - 0.5, low)
        law[length] = max(0.0, math.log(upper / lower) / scale)
    return law


def drawn_lengths(spec: RaggedSpec, stream: int, count: int) -> list[int]:
    """``count`` lengths drawn from :func:`length_law`'s variable, seeded by ``spec.seed`` and
    ``stream`` (a rank's or a call's): for rows built outside an engine (the train part)."""
    draw = random.Random(f"lrft-ragged/{spec.seed}/{stream}")
    ratio = spec.max_tokens / spec.min_tokens
    return [
        min(spec.max_tokens, round(spec.min_tokens * ratio ** draw.random())) for _ in range(count)
    ]


def expected_length(spec: RaggedSpec) -> float:
    """The law's mean (about ``(max - min) / ln(max / min)``: 346 tokens for 64-1024)."""
    return sum(length * p for length, p in enumerate(length_law(spec)))


def hazards(spec: RaggedSpec) -> list[float]:
    """``P(length = j | length >= j)`` for ``j`` in ``0..max_tokens`` (1 at ``max_tokens``)."""
    law = length_law(spec)
    table, left = [0.0] * len(law), 1.0
    for index, p in enumerate(law):
        table[index] = min(1.0, p / left) if left > 1e-12 else 1.0
        left -= p
    table[-1] = 1.0
    return table


class EndDraw:
    """The forward hook that ends responses at drawn lengths (see module doc), for prompts of
    ``prompt_tokens`` tokens. ``enabled`` (a device flag, so that captured graphs follow it)
    switches the ends on and off without detaching the hook."""

    def __init__(
        self,
        spec: RaggedSpec,
        *,
        vocab_size: int,
        prompt_tokens: int,
        eos_token_id: int,
        device: torch.device | str,
    ) -> None:
        if not 0 <= eos_token_id < vocab_size:
            raise ValueError(
                f"eos_token_id {eos_token_id} is outside the vocabulary (0..{vocab_size - 1})"
            )
        self.spec = spec
        self.prompt_tokens = prompt_tokens
        self.eos_token_id = eos_token_id
        device = torch.device(device)
        generator = torch.Generator().manual_seed(spec.seed)
        self.token_uniform = torch.rand(vocab_size, generator=generator).to(device)
        self.step_uniform = torch.rand(spec.max_tokens + 1, generator=generator).to(device)
        self.hazard = torch.tensor(hazards(spec), dtype=torch.float32).to(device)
        only_eos = torch.full((vocab_size,), float("-inf"))
        only_eos[eos_token_id] = 0.0
        self.only_eos = only_eos.to(device)
        self.enabled = torch.ones((), dtype=torch.bool, device=device)

    def ends(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """Whether the token after each fed token (``input_ids`` at ``position_ids``, positions
        counted from each prompt's first token) must be EOS."""
        index = (position_ids - self.prompt_tokens + 2).clamp(0, self.spec.max_tokens)
        token = input_ids.clamp(0, self.token_uniform.numel() - 1)
        u = torch.frac(self.token_uniform[token] + self.step_uniform[index])
        return self.enabled & (u < self.hazard[index])

    def force(
        self, logits: torch.Tensor, input_ids: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """``logits`` ``(batch, kept, vocab)`` with EOS the only choice where a response ends."""
        ends = self.ends(input_ids, position_ids)
        return torch.where(ends[..., None], self.only_eos.to(logits.dtype), logits)

    def attach(self, model: torch.nn.Module) -> torch.utils.hooks.RemovableHandle:
        """Hook ``model``'s forward (a transformers causal LM called with keyword arguments, as
        ``generate``, continuous batching and lrft's engine call it); ``.remove()`` detaches."""
        return model.register_forward_hook(self._hook, with_kwargs=True)

    def _hook(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> Any:
        input_ids, positions = kwargs.get("input_ids"), kwargs.get("position_ids")
        if input_ids is None or positions is None or positions.dim() != 2:
            raise LrftError(
                f"ragged ends need input_ids and 2-D position_ids passed to "
                f"{type(module).__name__} by keyword (got input_ids "
                f"{None if input_ids is None else tuple(input_ids.shape)}, position_ids "
                f"{None if positions is None else tuple(positions.shape)})"
            )
        logits = output.logits
        kept = logits.shape[1]
        if kept != input_ids.shape[1]:
            which = kwargs.get("logits_to_keep")
            if isinstance(which, torch.Tensor):  # continuous batching: the rows' last tokens
                input_ids, positions = input_ids[:, which], positions[:, which]
            else:
                input_ids, positions = input_ids[:, -kept:], positions[:, -kept:]
        output.logits = self.force(logits, input_ids, positions)
        return output


class RecordedLengths:
    """A ``RolloutEngine`` that passes every call to ``engine`` and records, per generate call,
    each response's length and whether it ended at a stop id (``stopped``)."""

    def __init__(self, engine: RolloutEngine) -> None:
        self.engine = engine
        self.generated: list[list[int]] = []
        self.stopped: list[list[bool]] = []

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        results = self.engine.generate(requests, params)
        self.generated.append([len(result.output_token_ids) for result in results])
        self.stopped.append([result.finish_reason == "stop" for result in results])
        return results

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

    def __enter__(self) -> RecordedLengths:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()


def full_batch_tokens_per_s(trainer: RLTrainer, draw: EndDraw) -> float:
    """Generated tokens per second of the trainer's rollout with the ends switched off (every
    response ``generate_max_len`` long): the full batch's rate. The second of two calls, so
    that graphs the ragged steps did not need are captured outside the timed one."""
    maker = trainer.maker
    params = attrs.evolve(maker.sampling, seed=0)
    prompts = trainer.train_data.select(trainer.sampler.next_batch().indices)
    draw.enabled.fill_(False)
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
        draw.enabled.fill_(True)
    return sum(len(result.output_token_ids) for result in results) / seconds
