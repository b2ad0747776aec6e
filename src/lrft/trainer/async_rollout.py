"""The trainer side of the split placement: a :class:`~lrft.trainer.rollout.Rollout` fed by the
rollout ranks (:class:`lrft.trainer.rollout_worker.RolloutWorker`).

Each iteration's batch was generated and scored on the rollout ranks, by weights at most
``max_staleness`` versions older than the trainer's (:mod:`lrft.trainer.split_plan`). The
trainer's sender takes every rollout rank's share of it over the exchange group, refuses it if
it lags more than the bound, and hands each trainer rank the contiguous share of the batch its
own sampler names (every trainer rank checks the prompts are exactly those: none lost, none
repeated). Every row carries the version of the weights that generated it into the replay
buffer and the trajectories; the step's metrics hold its staleness histogram. The policy loss
corrects with the engines' logprobs (truncated importance sampling), which the rollout ranks
return with every token.

Every wait on the rollout ranks is a phase of the watch (``receive_samples``,
``receive_eval``), bounded by ``--collective_timeout_s``: a stalled or dead rollout rank stops
the trainer with a ``CollectiveTimeout`` naming the phase and every rank's last one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import attrs
import torch
import torch.distributed as dist
from torch import Tensor

from lrft.api.errors import LrftError
from lrft.api.types import SamplingParams
from lrft.data import DistributedPromptSampler, PromptDataset, PromptSample, eval_indices
from lrft.dist import PhaseWatch, SplitGroups
from lrft.dist.split import SENDER
from lrft.rewards import RewardOutput
from lrft.trainer.colocation import Colocation
from lrft.trainer.experience import ExperienceMaker, pack_engine_logprobs
from lrft.trainer.process_rewards import ProcessRewards, process_token_rewards
from lrft.trainer.rollout import RolloutBatch
from lrft.trainer.sampling import concat_rewards
from lrft.trainer.sequences import pack, row_media
from lrft.trainer.split_plan import (
    BATCH_TAG,
    EVAL_TAG,
    EvalShare,
    RolloutShare,
    RunStart,
    staleness_metrics,
)


def _scatter(value: list[object] | None) -> object:
    """The sender's ``value[r]`` on trainer rank ``r`` (the trainer group, the default one)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        assert value is not None
        return value[0]
    out: list[object] = [None]
    dist.scatter_object_list(out, value, src=SENDER)
    return out[0]


@attrs.define(kw_only=True, eq=False)
class AsyncRollout:
    """Batches from the rollout ranks; see the module docstring. ``total``: the run's last
    iteration; ``eval_every``: ``eval_steps``; ``eval_size``: how many held-out prompts there
    are (0: none); ``version``: the version of the trainer's weights the rollout ranks hold now
    (synced last)."""

    groups: SplitGroups
    colocation: Colocation
    maker: ExperienceMaker
    data: PromptDataset
    eval_size: int
    sampler: DistributedPromptSampler
    n: int
    max_staleness: int
    total: int
    eval_every: int
    watch: PhaseWatch
    version: int = 0
    process: ProcessRewards | None = None
    """The process reward model (``--prm_pretrain``), held by the trainer ranks: it scores each
    batch's steps once the batch arrives, as the reference and the teacher score it."""

    @property
    def _train_ranks(self) -> int:
        return self.groups.layout.train_world_size

    def begin(self, step: int) -> None:
        """Tell the rollout ranks where the run starts (before the first sync)."""
        self.version = step
        exchange = self.groups.exchange
        if exchange is None:
            return
        start = RunStart(
            step=step,
            total=self.total,
            sampler=self.sampler.state_dict(),
            evaluates=self.eval_size > 0,
            eval_every=self.eval_every,
        )
        with self.watch.phase("start_rollout_ranks"):
            exchange.broadcast_object(start, SENDER)

    def collect(self, step: int) -> RolloutBatch:
        part, metrics = self.colocation.plain("receive_samples", lambda: self._my_share(step))
        expected = self.sampler.next_batch().indices
        if part.indices != expected:
            lost = sorted(set(expected) - set(part.indices))
            repeated = sorted(i for i in set(part.indices) if part.indices.count(i) > 1)
            extra = sorted(set(part.indices) - set(expected))
            raise LrftError(
                f"step {step + 1}: this trainer rank was handed prompts {list(part.indices)}, "
                f"its sampler's share of the batch is {list(expected)}: lost {lost}, repeated "
                f"{repeated}, not of this batch {extra}"
            )
        prompts = self.data.select(part.indices)
        results = list(part.results)
        sequences = pack(results, media=row_media(prompts, self.n))
        engine_logprobs = None
        if self.maker.sampling.return_logprobs:
            engine_logprobs = pack_engine_logprobs(results, sequences.action_mask.shape[1])
        rewards = part.rewards
        shaped = self.maker.shape(rewards.scores_tensor(), sequences.action_mask.sum(-1))
        token_rewards, process_metrics = process_token_rewards(
            self.colocation, self.process, sequences, shaped
        )
        # the trainer trains this batch, then syncs the next version to the rollout ranks
        self.version = step + 1
        return RolloutBatch(
            prompts=prompts,
            results=results,
            sequences=sequences,
            rewards=rewards,
            shaped=shaped,
            token_rewards=token_rewards,
            engine_logprobs=engine_logprobs,
            generated=rewards,
            metrics={**metrics, **process_metrics},
            weight_versions=torch.full((len(results),), part.version, dtype=torch.long),
        )

    def _my_share(self, step: int) -> tuple[RolloutShare, dict[str, float]]:
        shares = None if self.groups.exchange is None else self._receive(step)
        return cast(tuple[RolloutShare, dict[str, float]], _scatter(shares))

    def _receive(self, step: int) -> list[object]:
        """The sender: every rollout rank's share of batch ``step``, checked, cut into one
        share per trainer rank (with the step's metrics)."""
        exchange = self.groups.exchange
        assert exchange is not None
        layout = self.groups.layout
        parts = [
            checked_share(
                exchange.recv_object(rank, tag=BATCH_TAG),
                step=step,
                max_staleness=self.max_staleness,
                where=layout.describe(rank),
            )
            for rank in layout.rollout_ranks
        ]
        lags = torch.tensor([step - p.version for p in parts for _ in p.results])
        metrics = staleness_metrics(lags, self.max_staleness)
        for name in ("generate", "rewards"):
            slowest = max(p.seconds.get(name, 0.0) for p in parts)
            metrics[f"time/rollout_{name}_s"] = slowest
        shares = cut_batch(parts, ranks=self._train_ranks, n=self.n)
        return [(share, metrics) for share in shares]

    def eval_scores(self, prompts: Sequence[PromptSample], params: SamplingParams) -> Tensor:
        """The rollout ranks' greedy scores of this trainer rank's held-out prompts
        (``eval_indices`` of its rank), under the weights synced last."""
        with self.watch.phase("receive_eval"):
            merged = None if self.groups.exchange is None else self._receive_eval()
            scores = _scatter(None if merged is None else [merged] * self._train_ranks)
        assert isinstance(scores, dict)
        rank = dist.get_rank() if dist.is_initialized() else 0
        mine = eval_indices(self.eval_size, rank=rank, world_size=self._train_ranks)
        if len(mine) != len(prompts):
            raise LrftError(
                f"{len(prompts)} held-out prompts asked for, trainer rank {rank}'s share is "
                f"{len(mine)}"
            )
        return torch.tensor([scores[index] for index in mine], dtype=torch.float32)

    def _receive_eval(self) -> dict[int, float]:
        exchange = self.groups.exchange
        assert exchange is not None
        merged: dict[int, float] = {}
        for rank in self.groups.layout.rollout_ranks:
            share = exchange.recv_object(rank, tag=EVAL_TAG)
            if not isinstance(share, EvalShare) or share.version != self.version:
                got = getattr(share, "version", type(share).__name__)
                raise LrftError(
                    f"{self.groups.layout.describe(rank)} evaluated the weights of version {got}, "
                    f"the trainer's are version {self.version}"
                )
            merged.update(share.scores)
        if sorted(merged) != list(range(self.eval_size)):
            raise LrftError(
                f"the rollout ranks scored {len(merged)} held-out prompts of {self.eval_size}"
            )
        return merged


def checked_share(part: object, *, step: int, max_staleness: int, where: str) -> RolloutShare:
    """``part`` if it is batch ``step``, generated by weights at most ``max_staleness``
    versions older than the trainer's (version ``step``); ``where`` names its sender."""
    if not isinstance(part, RolloutShare) or part.batch != step:
        got = getattr(part, "batch", type(part).__name__)
        raise LrftError(f"{where} sent batch {got} when the trainer takes batch {step}")
    lag = step - part.version
    if not 0 <= lag <= max_staleness:
        raise LrftError(
            f"{where} generated batch {step} with the weights of version {part.version}, "
            f"{lag} versions behind the trainer's {step}: the bound is max_staleness "
            f"{max_staleness}"
        )
    return part


def cut_batch(parts: Sequence[RolloutShare], *, ranks: int, n: int) -> list[RolloutShare]:
    """A batch (the rollout ranks' shares in their order, which is the sampler's) cut into
    ``ranks`` contiguous shares of whole groups of ``n`` results, one per trainer rank."""
    indices = [i for p in parts for i in p.indices]
    results = [r for p in parts for r in p.results]
    rewards = concat_rewards([p.rewards for p in parts])
    versions = [p.version for p in parts for _ in p.indices]
    if len(indices) % ranks:
        raise LrftError(f"a batch of {len(indices)} prompts does not split over {ranks} ranks")
    per_rank = len(indices) // ranks
    shares = []
    for rank in range(ranks):
        prompts = slice(rank * per_rank, (rank + 1) * per_rank)
        rows = slice(prompts.start * n, prompts.stop * n)
        mine = set(versions[prompts])
        if len(mine) != 1:  # the rollout ranks take every sync together
            raise LrftError(f"batch {parts[0].batch} came from weight versions {sorted(mine)}")
        shares.append(
            RolloutShare.of(
                batch=parts[0].batch,
                version=mine.pop(),
                indices=tuple(indices[prompts]),
                results=tuple(results[rows]),
                rewards=RewardOutput(
                    scores=rewards.scores[rows],
                    metrics={name: v[rows] for name, v in rewards.metrics.items()},
                ),
                seconds={},
            )
        )
    return shares
