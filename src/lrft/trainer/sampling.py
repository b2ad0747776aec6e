"""Sampling strategies of the rollout: FIRE's hot first token and DAPO's dynamic sampling.

- :func:`fire_generate`: the first token of each response sampled at a high temperature, the
  rest at the regular one (Chen et al. 2024, "Flaming-hot Initiation with Regular Execution
  Sampling for Large Language Models"), through any :class:`~lrft.api.RolloutEngine`: engines
  sample a whole call at one temperature, so the first token is a call of its own.
- :func:`refill_groups`: the groups of responses whose rewards are all equal are dropped and
  the batch is refilled from further prompts (Yu et al. 2025, "DAPO", dynamic sampling), for a
  bounded number of generate rounds. Which groups to drop is :func:`lrft.algo
  .dynamic_sampling_filter`'s decision; this module owns the loop and its bookkeeping.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Sequence

import attrs
import torch
from torch import Tensor

from lrft.algo import dynamic_sampling_filter, group_ids_from_size
from lrft.api.types import GenerationRequest, GenerationResult, SamplingParams
from lrft.data import PromptSample
from lrft.rewards import RewardOutput

GenerateFn = Callable[[Sequence[GenerationRequest], SamplingParams], list[GenerationResult]]


def fire_generate(
    generate: GenerateFn,
    requests: Sequence[GenerationRequest],
    params: SamplingParams,
    *,
    first_token_temperature: float,
) -> list[GenerationResult]:
    """``generate`` with each response's first token sampled at ``first_token_temperature``.

    Two calls: one token per sample at the hot temperature, then each unfinished sample
    continued on its own (``n=1``, prompt + first token) with ``params``; the results are
    joined, so they read as one call's (``params.n`` per request, request-major, the original
    prompts; engine logprobs at the temperature each token was sampled at). Both calls are made
    on every rank, even with nothing to continue, since ``generate`` may be collective.
    """
    first_params = attrs.evolve(
        params,
        temperature=first_token_temperature,
        max_new_tokens=1,
        min_new_tokens=min(params.min_new_tokens, 1),
    )
    heads = generate(requests, first_params)
    if params.max_new_tokens == 1:
        return heads
    open_rows = [row for row, head in enumerate(heads) if head.finish_reason == "length"]
    continuations = []
    for row in open_rows:
        media = requests[row // params.n].media
        continuations.append(
            GenerationRequest(
                prompt_token_ids=(*heads[row].prompt_token_ids, *heads[row].output_token_ids),
                request_id=f"{heads[row].request_id}/{heads[row].sample_index}",
                media=None if media is None else media.continued(heads[row].output_token_ids),
            )
        )
    rest_params = attrs.evolve(
        params,
        n=1,
        max_new_tokens=params.max_new_tokens - 1,
        min_new_tokens=max(params.min_new_tokens - 1, 0),
        seed=None if params.seed is None else continuation_seed(params.seed),
    )
    tails = dict(zip(open_rows, generate(continuations, rest_params), strict=True))
    results = []
    for row, head in enumerate(heads):
        tail = tails.get(row)
        if tail is None:
            results.append(head)
            continue
        logprobs = None
        if head.logprobs is not None and tail.logprobs is not None:
            logprobs = (*head.logprobs, *tail.logprobs)
        results.append(
            attrs.evolve(
                head,
                output_token_ids=head.output_token_ids + tail.output_token_ids,
                finish_reason=tail.finish_reason,
                logprobs=logprobs,
            )
        )
    return results


def continuation_seed(seed: int) -> int:
    """The seed of FIRE's continuation call, derived from the first call's ``seed``.

    Reusing the first call's seed would replay its random stream, and ``seed + 1`` is another
    rank's rollout seed.
    """
    digest = hashlib.blake2b(f"lrft-fire/{seed}".encode(), digest_size=7).digest()
    return int.from_bytes(digest, "little")


def _prompts(values: Iterable[PromptSample]) -> tuple[PromptSample, ...]:
    return tuple(values)


def _results(values: Iterable[GenerationResult]) -> tuple[GenerationResult, ...]:
    return tuple(values)


@attrs.frozen(kw_only=True, eq=False)
class ScoredGroups:
    """Prompts with their responses, ``len(results) // len(prompts)`` per prompt, prompt-major.

    ``rewards``: the reward function's output for each response; ``shaped``: what the advantages
    see (its scores after shaping, (B,)), which is what dynamic sampling compares.
    """

    prompts: tuple[PromptSample, ...] = attrs.field(converter=_prompts)
    results: tuple[GenerationResult, ...] = attrs.field(converter=_results)
    rewards: RewardOutput
    shaped: Tensor

    def __attrs_post_init__(self) -> None:
        rows = len(self.results)
        if not self.prompts or rows % len(self.prompts):
            raise ValueError(
                f"{rows} results do not split into groups of equal size over "
                f"{len(self.prompts)} prompts"
            )
        if len(self.rewards) != rows or self.shaped.shape != (rows,):
            raise ValueError(
                f"{len(self.rewards)} rewards and shaped rewards of shape "
                f"{tuple(self.shaped.shape)} for {rows} results: one each per result"
            )

    @property
    def group_size(self) -> int:
        return len(self.results) // len(self.prompts)

    def group(self, index: int) -> ScoredGroups:
        n = self.group_size
        rows = slice(index * n, (index + 1) * n)
        return ScoredGroups(
            prompts=self.prompts[index : index + 1],
            results=self.results[rows],
            rewards=RewardOutput(
                scores=self.rewards.scores[rows],
                metrics={name: values[rows] for name, values in self.rewards.metrics.items()},
            ),
            shaped=self.shaped[rows],
        )

    @staticmethod
    def concat(parts: Sequence[ScoredGroups]) -> ScoredGroups:
        return ScoredGroups(
            prompts=[p for part in parts for p in part.prompts],
            results=[r for part in parts for r in part.results],
            rewards=concat_rewards([part.rewards for part in parts]),
            shaped=torch.cat([part.shaped for part in parts]),
        )


def concat_rewards(outputs: Sequence[RewardOutput]) -> RewardOutput:
    """The outputs one after the other; a metric missing from one is NaN (not measured) there."""
    names = sorted({name for output in outputs for name in output.metrics})
    return RewardOutput(
        scores=[score for output in outputs for score in output.scores],
        metrics={
            name: [
                value
                for output in outputs
                for value in output.metrics.get(name, (math.nan,) * len(output))
            ]
            for name in names
        },
    )


@attrs.frozen(kw_only=True, eq=False)
class Refill:
    """What :func:`refill_groups` returns.

    ``batch``: exactly as many groups as the first round had, those with a reward spread first,
    in the order generated, then (only when the rounds ran out) zero-variance groups to fill
    the batch. ``generated``: the reward of every response generated, kept or not (an unbiased
    view of the policy). ``metrics``: ``dynamic_sampling/*`` counts, summed over ranks.
    """

    batch: ScoredGroups
    generated: RewardOutput
    metrics: dict[str, float]


def refill_groups(
    roll_out: Callable[[int], ScoredGroups],
    *,
    max_rounds: int,
    global_sum: Callable[[list[float]], list[float]],
) -> Refill:
    """Generate rounds of groups until every rank holds as many groups with a reward spread as
    the first round generated, or ``max_rounds`` rounds were made.

    ``roll_out(round)`` takes the next prompts (from the data sampler, so that its resumable
    position counts every prompt consumed), generates and scores them. ``global_sum`` sums
    values over the ranks (identity on one rank); the decision to make another round is taken
    on the sum, so every rank makes the same number of rounds and its collective calls stay
    matched. Metrics: ``rounds``, ``generated_groups``, ``dropped_groups`` (zero-variance groups
    generated), ``padded_groups`` (zero-variance groups put back because the rounds ran out).
    """
    if max_rounds < 1:
        raise ValueError(f"max_rounds must be >= 1, got {max_rounds}")
    kept: list[ScoredGroups] = []
    dropped: list[ScoredGroups] = []
    parts: list[ScoredGroups] = []
    target = 0
    rounds = 0
    while True:
        part = roll_out(rounds)
        rounds += 1
        parts.append(part)
        target = target or len(part.prompts)
        groups = group_ids_from_size(len(part.results), part.group_size)
        verdict = dynamic_sampling_filter(part.shaped, groups)
        group_keeps = verdict.keep[:: part.group_size].tolist()
        for index, keep in enumerate(group_keeps):
            (kept if keep else dropped).append(part.group(index))
        (missing,) = global_sum([float(max(target - len(kept), 0))])
        if missing == 0 or rounds == max_rounds:
            break
    chosen = kept[:target]
    padding = dropped[: target - len(chosen)]
    generated, zero_variance, padded = global_sum(
        [float(sum(len(p.prompts) for p in parts)), float(len(dropped)), float(len(padding))]
    )
    metrics = {
        "dynamic_sampling/rounds": float(rounds),
        "dynamic_sampling/generated_groups": generated,
        "dynamic_sampling/dropped_groups": zero_variance,
        "dynamic_sampling/padded_groups": padded,
    }
    return Refill(
        batch=ScoredGroups.concat(chosen + padding),
        generated=concat_rewards([part.rewards for part in parts]),
        metrics=metrics,
    )
