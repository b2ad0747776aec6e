"""How an iteration's samples are made: the :class:`Rollout` Protocol and one class per mode.

An iteration (docs/trainer.md, "One iteration") starts with its rollout: take prompts from the
sampler, wake the engine, generate, put the engine to sleep, and score the responses. What
follows (logprob passes, advantages, policy and critic epochs, the weight sync, the records)
is the same for every mode, so a rollout hands it one :class:`RolloutBatch`. A new way of making
samples is a new class here, never a branch in :meth:`lrft.trainer.RLTrainer.train_step`:

- :class:`SingleTurnRollout`: one response per sample (the default);
- :class:`RefillRollout`: DAPO's dynamic sampling, generate-and-score rounds until the batch
  holds groups with a reward spread only (:func:`lrft.trainer.sampling.refill_groups`);
- :class:`EpisodeRollout`: multi-turn episodes of an environment
  (:class:`lrft.trainer.episodes.EpisodeRunner`);
- :class:`lrft.trainer.async_rollout.AsyncRollout`: the trainer side of the split placement,
  fed by the rollout ranks (synchronous, or up to ``max_staleness`` versions behind).

Every method is collective over the default group (the engine's TP group generates together;
reward models may be sharded): every rank calls it, also one with no prompts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import attrs
import torch
from torch import Tensor

from lrft.api.types import GenerationResult, SamplingParams
from lrft.data import DistributedPromptSampler, PromptDataset, PromptSample
from lrft.dist import PhaseWatch, sum_over_ranks
from lrft.rewards import RewardOutput
from lrft.trainer.colocation import Colocation
from lrft.trainer.episodes import EpisodeBatch, EpisodeRunner, with_returns
from lrft.trainer.experience import ExperienceMaker, pack_engine_logprobs
from lrft.trainer.process_rewards import ProcessRewards, process_token_rewards
from lrft.trainer.sampling import Refill, ScoredGroups, continuation_seed, refill_groups
from lrft.trainer.sequences import Sequences, pack, row_media

EVAL_SLEEP_LEVEL = 1
"""Evaluation sleeps the engine at level 1 at most: no weight sync follows it, and level 2 would
leave the next rollout stale weights."""


@attrs.frozen(kw_only=True, eq=False)
class RolloutBatch:
    """One iteration's samples, the same record for every mode.

    ``prompts``: one per group, each with ``len(results) // len(prompts)`` responses,
    prompt-major. ``results``: the responses trained on (an episode's: its final model turn).
    ``sequences``: prompt and response tokens as the logprob passes read them. ``rewards``: the
    score of each trained row (an episode's: with its environment return) with the reward's
    metrics; ``shaped``: (B,) what the advantages see. ``token_rewards``: (B, T) per-token
    rewards (an episode's turns; process rewards' steps with the outcome), or ``None``. ``engine_logprobs``: (B, T) the engine's own
    logprobs of the response tokens when the sampling asked for them (truncated importance
    sampling), else ``None``. ``generated``: the reward of every response generated, trained or
    not (what the step's reward metrics report). ``metrics``: the mode's own counters.
    ``episodes``: the episodes' turns, for the trajectory records. ``weight_versions``: (B,)
    the version of the weights that generated each row, where they may lag the trainer's (the
    split placement), else ``None``.
    """

    prompts: Sequence[PromptSample]
    results: Sequence[GenerationResult]
    sequences: Sequences
    rewards: RewardOutput
    shaped: Tensor
    token_rewards: Tensor | None
    engine_logprobs: Tensor | None
    generated: RewardOutput
    metrics: dict[str, float]
    episodes: EpisodeBatch | None = None
    weight_versions: Tensor | None = None

    @property
    def responses(self) -> Sequence[GenerationResult]:
        """What a trajectory record shows of each row: the whole episode, or the response."""
        return self.results if self.episodes is None else self.episodes.responses


@runtime_checkable
class Rollout(Protocol):
    """Makes an iteration's samples (:meth:`collect`) and scores held-out prompts
    (:meth:`eval_scores`); both collective over the default group."""

    def begin(self, step: int) -> None:
        """Called once before a run's first weight sync, with the iteration it starts from (0,
        or a resumed checkpoint's step). Collective."""
        ...

    def collect(self, step: int) -> RolloutBatch:
        """The samples of iteration ``step`` (0-based), taking its prompts from the sampler."""
        ...

    def eval_scores(self, prompts: Sequence[PromptSample], params: SamplingParams) -> Tensor:
        """The score of one response per prompt sampled with ``params`` (greedy in evaluation),
        touching no sampler, statistics or parameters."""
        ...


@attrs.frozen(kw_only=True)
class RolloutSeeds:
    """The sampling seed of each rollout: shared by the ranks of a TP group (which generate
    together), different across groups, steps and dynamic-sampling rounds."""

    seed: int
    rank: int
    tp_size: int

    def __call__(self, step: int, round_index: int = 0) -> int:
        leader = self.rank - self.rank % self.tp_size
        seed = (self.seed * 1_000_003 + step) * 4096 + leader
        return seed if round_index == 0 else continuation_seed(seed + round_index * (1 << 62))


def training_rewards(
    maker: ExperienceMaker,
    prompts: Sequence[PromptSample],
    results: Sequence[GenerationResult],
    n: int,
    task_reward: bool,
) -> RewardOutput:
    """The reward of each training sample (``n`` per prompt): the maker's, or 0 for each when
    the task reward is off (``no_task_reward``; evaluation still scores)."""
    if not task_reward:
        return RewardOutput(scores=[0.0] * len(results))
    return maker.rate(prompts, results, n)


@attrs.frozen(kw_only=True, eq=False)
class RolloutParts:
    """What every mode reads: the phases, the experience maker (engine, reward, sampling), the
    prompts and their sampler, the seeds, and the group size ``n``. ``task_reward``: whether
    training samples are scored by the reward (``--no_task_reward`` turns it off; evaluation
    always scores)."""

    colocation: Colocation
    maker: ExperienceMaker
    data: PromptDataset
    sampler: DistributedPromptSampler
    seeds: RolloutSeeds
    n: int
    task_reward: bool = True
    process: ProcessRewards | None = None
    """The process reward model's token rewards (``--prm_pretrain``), or ``None``."""

    def rate(
        self, prompts: Sequence[PromptSample], results: Sequence[GenerationResult]
    ) -> RewardOutput:
        """The reward of each training sample (``n`` per prompt), in the ``rewards`` phase."""
        return self.colocation.plain(
            "rewards",
            lambda: training_rewards(self.maker, prompts, results, self.n, self.task_reward),
        )

    def next_prompts(self) -> Sequence[PromptSample]:
        return self.data.select(self.sampler.next_batch().indices)

    def token_rewards(
        self, sequences: Sequences, shaped: Tensor
    ) -> tuple[Tensor | None, dict[str, float]]:
        """The process rewards' token rewards and metrics (:func:`process_token_rewards`)."""
        return process_token_rewards(self.colocation, self.process, sequences, shaped)

    def params(self, step: int, round_index: int = 0) -> SamplingParams:
        return attrs.evolve(self.maker.sampling, seed=self.seeds(step, round_index))

    def engine_logprobs(self, results: Sequence[GenerationResult], steps: int) -> Tensor | None:
        """The engine's logprobs of ``results`` as a (B, ``steps``) tensor, when the sampling
        asks the engine for them (truncated importance sampling reads them)."""
        if not self.maker.sampling.return_logprobs:
            return None
        return pack_engine_logprobs(results, steps)

    def greedy_scores(self, prompts: Sequence[PromptSample], params: SamplingParams) -> Tensor:
        results = self.colocation.rollout(
            lambda: self.maker.generate(prompts, params),
            name="eval_generate",
            sleep_level=EVAL_SLEEP_LEVEL,
        )
        scores, _ = self.maker.score(prompts, results, 1)
        return scores


class _FromTheSampler:
    """A rollout that takes each iteration's prompts from the sampler as it goes: a run's
    start needs nothing of it."""

    def begin(self, step: int) -> None:
        return None


class SingleTurnRollout(_FromTheSampler):
    """One response per sample: generate, then score (the default mode)."""

    def __init__(self, parts: RolloutParts) -> None:
        self.parts = parts

    def collect(self, step: int) -> RolloutBatch:
        parts, col, maker, n = self.parts, self.parts.colocation, self.parts.maker, self.parts.n
        prompts = parts.next_prompts()
        params = parts.params(step)
        results = col.rollout(lambda: maker.generate(prompts, params))
        rewards = parts.rate(prompts, results)
        sequences = pack(results, media=row_media(prompts, n))
        shaped = maker.shape(rewards.scores_tensor(), sequences.action_mask.sum(-1))
        token_rewards, metrics = parts.token_rewards(sequences, shaped)
        return RolloutBatch(
            prompts=prompts,
            results=results,
            sequences=sequences,
            rewards=rewards,
            shaped=shaped,
            token_rewards=token_rewards,
            engine_logprobs=parts.engine_logprobs(results, sequences.action_mask.shape[1]),
            generated=rewards,
            metrics=metrics,
        )

    def eval_scores(self, prompts: Sequence[PromptSample], params: SamplingParams) -> Tensor:
        return self.parts.greedy_scores(prompts, params)


class RefillRollout(_FromTheSampler):
    """DAPO's dynamic sampling: rounds of generate-and-score until the batch holds groups with
    a reward spread only. Each round takes the sampler's next batch, so a checkpoint's sampler
    position counts every prompt consumed."""

    def __init__(self, parts: RolloutParts, *, max_rounds: int, watch: PhaseWatch) -> None:
        self.parts = parts
        self.max_rounds = max_rounds
        self.watch = watch

    def _round(self, step: int, round_index: int) -> ScoredGroups:
        parts, col, maker = self.parts, self.parts.colocation, self.parts.maker
        prompts = parts.next_prompts()
        params = parts.params(step, round_index)
        # Level 1 at most: another round may follow, and level 2 would leave it stale weights.
        results = col.rollout(lambda: maker.generate(prompts, params), sleep_level=1)
        rewards = parts.rate(prompts, results)
        lengths = torch.tensor([len(result.output_token_ids) for result in results])
        shaped = maker.shape(rewards.scores_tensor(), lengths)
        return ScoredGroups(prompts=prompts, results=results, rewards=rewards, shaped=shaped)

    def refill(self, step: int) -> Refill:
        device = self.parts.maker.device
        with self.watch.phase("dynamic_sampling"):
            return refill_groups(
                lambda round_index: self._round(step, round_index),
                max_rounds=self.max_rounds,
                global_sum=lambda values: sum_over_ranks(values, device),
            )

    def collect(self, step: int) -> RolloutBatch:
        refill = self.refill(step)
        batch = refill.batch
        prompts, results = list(batch.prompts), list(batch.results)
        sequences = pack(results, media=row_media(prompts, self.parts.n))
        token_rewards, metrics = self.parts.token_rewards(sequences, batch.shaped)
        return RolloutBatch(
            prompts=prompts,
            results=results,
            sequences=sequences,
            rewards=batch.rewards,
            shaped=batch.shaped,
            token_rewards=token_rewards,
            engine_logprobs=self.parts.engine_logprobs(results, sequences.action_mask.shape[1]),
            generated=refill.generated,
            metrics={**refill.metrics, **metrics},
        )

    def eval_scores(self, prompts: Sequence[PromptSample], params: SamplingParams) -> Tensor:
        return self.parts.greedy_scores(prompts, params)


class EpisodeRollout(_FromTheSampler):
    """Multi-turn episodes: each sample is an episode of an environment, trained on the
    model's own tokens, rewarded per turn by the environment plus the reward function's score
    of its final turn (:mod:`lrft.trainer.episodes`)."""

    def __init__(self, parts: RolloutParts, runner: EpisodeRunner) -> None:
        self.parts = parts
        self.runner = runner

    def collect(self, step: int) -> RolloutBatch:
        parts, col, maker = self.parts, self.parts.colocation, self.parts.maker
        prompts = parts.next_prompts()
        params = parts.params(step)
        episodes = col.rollout(lambda: self.runner.run(prompts, params))
        results = episodes.answers
        scored = parts.rate(prompts, results)
        rewards = with_returns(scored, episodes)
        return RolloutBatch(
            prompts=prompts,
            results=results,
            sequences=episodes.sequences,
            rewards=rewards,
            # no length shaping: an episode's length counts observations too
            shaped=rewards.scores_tensor(),
            token_rewards=episodes.token_rewards(scored.scores_tensor()),
            engine_logprobs=episodes.engine_logprobs if maker.sampling.return_logprobs else None,
            generated=rewards,
            metrics=episodes.metrics(),
            episodes=episodes,
        )

    def eval_scores(self, prompts: Sequence[PromptSample], params: SamplingParams) -> Tensor:
        col, maker = self.parts.colocation, self.parts.maker
        episodes = col.rollout(
            lambda: self.runner.run(prompts, params),
            name="eval_generate",
            sleep_level=EVAL_SLEEP_LEVEL,
        )
        scores, _ = maker.score(prompts, episodes.answers, 1)
        return scores + episodes.returns
