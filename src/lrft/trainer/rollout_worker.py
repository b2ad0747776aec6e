"""The rollout ranks of the split placement: take the trainer's weights, generate, score, send.

A :class:`RolloutWorker` holds an engine (in its TP group), the reward and the prompts, and no
optimizer state; a distillation teacher and a process reward model are the trainer ranks'. It
follows :func:`lrft.trainer.split_plan.rollout_events`: it takes part in every weight sync the
trainer makes (``broadcast``), scores the held-out prompts whenever the trainer evaluates, and
generates each batch as soon as the weights it may use have arrived, so that with
``max_staleness`` K >= 1 it generates up to K batches ahead while the trainer trains.
Each batch goes to the trainer's sender as one :class:`~lrft.trainer.split_plan.RolloutShare`
per rollout rank, posted without waiting for the trainer to take it (at most K + 1 in flight).

The prompt stream starts where the trainer says (:class:`~lrft.trainer.split_plan.RunStart`,
its sampler's position), so a resumed run generates exactly the batches it has not trained. The
engine stays awake: no training shares its device. Every wait is a phase of the watch, bounded
by ``--collective_timeout_s``.
"""

from __future__ import annotations

import collections
import time

import attrs

from lrft.api.protocols import RolloutEngine
from lrft.backends.sync.broadcast import BroadcastSync
from lrft.data import DistributedPromptSampler, PromptDataset, eval_indices
from lrft.dist import PhaseWatch, SplitGroups
from lrft.dist.span import Pending, SpanGroup
from lrft.dist.split import SENDER
from lrft.trainer.experience import ExperienceMaker
from lrft.trainer.rollout import RolloutSeeds, training_rewards
from lrft.trainer.split_plan import (
    BATCH_TAG,
    EVAL_TAG,
    EvalShare,
    RolloutShare,
    RunStart,
    rollout_events,
)
from lrft.trainer.trainer import FitResult


@attrs.frozen(kw_only=True, eq=False)
class WorkerParts:
    """What a rollout rank runs: its groups, engine, experience maker (engine, TP group,
    reward, sampling), the weight sync, the prompts and their sampler (over the rollout ranks),
    the sampling seeds, the group size ``n``, the staleness bound and the phase watch."""

    groups: SplitGroups
    engine: RolloutEngine
    maker: ExperienceMaker
    sync: BroadcastSync
    data: PromptDataset
    eval_data: PromptDataset | None
    sampler: DistributedPromptSampler
    seeds: RolloutSeeds
    n: int
    max_staleness: int
    watch: PhaseWatch
    task_reward: bool = True
    """Whether training samples are scored (``no_task_reward`` turns it off; evaluation still
    scores)."""


class RolloutWorker:
    """One rollout rank's run; see the module docstring. :meth:`fit` is collective over the
    whole job."""

    def __init__(self, parts: WorkerParts) -> None:
        self.parts = parts
        self.rank = parts.groups.rank
        exchange = parts.groups.exchange
        assert exchange is not None, "every rollout rank is in the exchange group"
        self.exchange: SpanGroup = exchange
        self.version: int | None = None
        self._in_flight: collections.deque[Pending] = collections.deque()

    def fit(self) -> FitResult:
        """Every sync, evaluation and batch of the run (collective with the trainer ranks)."""
        began = time.perf_counter()
        watch = self.parts.watch
        try:
            with watch.phase("fit"):
                batches = self._run()
        except BaseException:
            watch.close(failed=True)
            raise
        watch.close()
        return FitResult(
            steps=batches, first_eval=None, last_eval=None, seconds=time.perf_counter() - began
        )

    def _run(self) -> int:
        parts, watch = self.parts, self.parts.watch
        with watch.phase("wait_for_trainer"):
            start: RunStart = self.exchange.broadcast_object(None, SENDER)
        parts.sampler.load_state_dict(start.sampler)
        batches = 0
        for kind, index in rollout_events(start, parts.max_staleness):
            if kind == "sync":
                watch.begin_step(index)
                with watch.phase("weight_sync"):
                    parts.sync.sync(None, parts.engine, version=index)
                self.version = index
            elif kind == "eval":
                self._evaluate(index)
            else:
                watch.begin_step(index + 1)
                self._generate(index)
                batches += 1
        with watch.phase("send_samples"):
            while self._in_flight:
                self._in_flight.popleft().wait()
        return batches

    def _generate(self, batch: int) -> None:
        """Batch ``batch``'s prompts (this rank's share), generated and scored, posted."""
        parts, watch = self.parts, self.parts.watch
        assert self.version is not None
        taken = parts.sampler.next_batch()
        prompts = parts.data.select(taken.indices)
        params = attrs.evolve(parts.maker.sampling, seed=parts.seeds(batch))
        began = time.perf_counter()
        with watch.phase("generate"), parts.sync.serving(parts.engine):
            results = parts.maker.generate(prompts, params)
        generated = time.perf_counter()
        with watch.phase("rewards"):
            rewards = training_rewards(parts.maker, prompts, results, parts.n, parts.task_reward)
        share = RolloutShare.of(
            batch=batch,
            version=self.version,
            indices=taken.indices,
            results=tuple(results),
            rewards=rewards,
            seconds={"generate": generated - began, "rewards": time.perf_counter() - generated},
        )
        # The trainer takes batch b at its step b: with K batches generated ahead, K + 1 may
        # be in flight. Posting returns at once; the oldest is awaited once more are queued.
        with watch.phase("send_samples"):
            while len(self._in_flight) > parts.max_staleness:
                self._in_flight.popleft().wait()
        self._in_flight.append(self.exchange.send_object(share, SENDER, tag=BATCH_TAG))

    def _evaluate(self, version: int) -> None:
        """Greedy scores of this rank's share of the held-out prompts, to the sender."""
        parts, watch = self.parts, self.parts.watch
        data = parts.eval_data
        assert data is not None, "the trainer evaluates: the held-out prompts are loaded"
        layout = parts.groups.layout
        indices = eval_indices(
            len(data),
            rank=layout.role_rank(self.rank),
            world_size=layout.rollout_world_size,
        )
        prompts = data.select(indices)
        # what the trainer's evaluate asks for: one greedy response per prompt
        greedy = attrs.evolve(parts.maker.sampling, n=1, temperature=0.0, seed=None)
        with watch.phase("eval_generate"), parts.sync.serving(parts.engine):
            results = parts.maker.generate(prompts, greedy)
        with watch.phase("eval_rewards"):
            scores, _ = parts.maker.score(prompts, results, 1)
        share = EvalShare(
            version=version,
            scores={index: float(score) for index, score in zip(indices, scores, strict=True)},
        )
        with watch.phase("send_eval"):
            self.exchange.send_object(share, SENDER, tag=EVAL_TAG).wait()
