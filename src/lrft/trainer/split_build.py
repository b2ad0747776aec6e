"""What ``lrft train`` builds on each rank: the colocated trainer, or a split placement's part.

:func:`build_job` checks the run before any process group starts (as
:func:`lrft.trainer.build.build_trainer` does), then for ``placement split`` starts the split
groups (:class:`lrft.dist.SplitLayout`: each role's ranks are their own default process group,
the span groups join the trainer's sender to every rollout rank) and a phase watch over the
whole job that names each rank's role. A trainer rank gets an :class:`RLTrainer` whose batches
come from the rollout ranks (:class:`lrft.trainer.async_rollout.AsyncRollout`); a rollout rank
gets a :class:`RolloutWorker`: the engine in its TP group, the reward, the prompts and the
broadcast sync, and no optimizer.
"""

from __future__ import annotations

from datetime import timedelta

import torch

from lrft.backends.sync.broadcast import BroadcastSync
from lrft.config import TrainConfig
from lrft.data import DistributedPromptSampler
from lrft.dist import (
    PhaseWatch,
    RankInfo,
    SplitGroups,
    SplitLayout,
    every_rank_arrives,
    init_split_distributed,
)
from lrft.trainer.build import build_trainer, prepare_run, prompt_sets, trainer_after_start
from lrft.trainer.components import rollout_engine, train_backend, weight_sync
from lrft.trainer.rewards import data_labels, task_reward
from lrft.trainer.rollout import RolloutSeeds
from lrft.trainer.rollout_stack import decoder, experience_maker
from lrft.trainer.rollout_worker import RolloutWorker, WorkerParts
from lrft.trainer.trainer import RLTrainer

PREPARED_KEY = "lrft/split/prepared"


def split_layout(config: TrainConfig, world_size: int) -> SplitLayout:
    assert config.rollout_world_size is not None
    return SplitLayout(
        world_size=world_size,
        rollout_world_size=config.rollout_world_size,
        tp_size=config.engine_tp_size,
    )


def role_info(info: RankInfo, layout: SplitLayout) -> RankInfo:
    """This rank's place in its role's group (its default process group), on the same device."""
    return RankInfo(
        rank=layout.role_rank(info.rank),
        local_rank=0,
        world_size=layout.role_world_size(info.rank),
        local_world_size=1,
        device=info.device,
    )


def build_job(
    config: TrainConfig,
    rank_info: RankInfo | None = None,
    *,
    groups: SplitGroups | None = None,
    checked: bool = False,
) -> RLTrainer | RolloutWorker:
    """This rank's part of the run ``config`` describes; see the module docstring. ``groups``:
    split groups already started (a test harness's), else they are started here; ``checked``:
    see :func:`lrft.trainer.build.prepare_run`."""
    if config.placement != "split":
        return build_trainer(config, rank_info, checked=checked)
    info = rank_info if rank_info is not None else RankInfo.from_env()
    prepare_run(config, info, checked=checked)
    layout = split_layout(config, info.world_size)
    timeout = timedelta(seconds=config.collective_timeout_s)
    if groups is None:
        groups = init_split_distributed(layout, rank=info.rank, device=info.device, timeout=timeout)
    else:
        # Started before this run's checks (a harness's groups): no rank may write its outputs
        # before every rank has checked them, as the rendezvous above ensures otherwise.
        every_rank_arrives(groups.store, PREPARED_KEY, info.world_size, timeout)
    watch = PhaseWatch(
        rank=info.rank,
        world_size=info.world_size,
        timeout_s=config.collective_timeout_s,
        store=groups.store,
        role=groups.role,
    )
    watch.start()
    try:
        with watch.phase("build"):
            if groups.role == "train":
                return trainer_after_start(config, role_info(info, layout), watch, split=groups)
            return rollout_worker(config, info, groups, watch)
    except BaseException:
        watch.close(failed=True)
        raise


def rollout_worker(
    config: TrainConfig, info: RankInfo, groups: SplitGroups, watch: PhaseWatch
) -> RolloutWorker:
    """A rollout rank's engine, reward, prompts and sync. Collective over the rollout ranks
    (the engines' TP groups, sharded reward models) and, through the sync, the span group."""
    assert config.pretrain is not None
    torch.manual_seed(config.seed)
    layout = groups.layout
    mine = role_info(info, layout)
    prompts = prompt_sets(config)
    # Reward models are sharded over the rollout ranks only; they hold no optimizer state.
    reward = task_reward(
        config, train_backend(config, mine), data_labels([prompts.train, prompts.eval])
    )
    # The engine sizes its memory share by the ranks of the whole host (vllm on CPU).
    engine = rollout_engine(config.pretrain, config, info)
    maker = experience_maker(
        config,
        engine=engine,
        decode=decoder(prompts.tokenizer),
        reward=reward,
        device=info.device,
        tp_group=groups.tp_group,
        eos_token_id=prompts.tokenizer.eos_token_id,
    )
    sync = weight_sync(config, groups)
    assert isinstance(sync, BroadcastSync)
    return RolloutWorker(
        WorkerParts(
            groups=groups,
            engine=engine,
            maker=maker,
            sync=sync,
            data=prompts.train,
            eval_data=prompts.eval,
            sampler=DistributedPromptSampler(
                num_samples=len(prompts.train),
                global_batch_size=config.rollout_batch_size,
                rank=mine.rank,
                world_size=mine.world_size,
                seed=config.seed,
            ),
            seeds=RolloutSeeds(seed=config.seed, rank=mine.rank, tp_size=config.engine_tp_size),
            n=config.n_samples_per_prompt,
            max_staleness=config.staleness_bound,
            watch=watch,
            task_reward=not config.no_task_reward,
        )
    )
