"""The rollout modes: each is a :class:`Rollout`, the builder picks one per config, and their
sampling seeds follow the published rule (shared inside a TP group, distinct elsewhere)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from lrft.cli import config_from_args
from lrft.dist import PhaseWatch
from lrft.trainer.build import _rollout
from lrft.trainer.rollout import (
    EpisodeRollout,
    RefillRollout,
    Rollout,
    RolloutParts,
    RolloutSeeds,
    SingleTurnRollout,
)
from lrft.trainer.sampling import continuation_seed

MODEL = ["train", "--pretrain=m", "--prompt_data=p.jsonl", "--reward_fn=math"]


def _parts() -> RolloutParts:
    # The builder only reads the parts' types here; the modes' behaviour is proven end to end
    # by the trainer's torchrun tests and the demo's step-by-step figures.
    unused = cast(Any, object())
    return RolloutParts(
        colocation=unused,
        maker=unused,
        data=unused,
        sampler=unused,
        seeds=RolloutSeeds(seed=0, rank=0, tp_size=1),
        n=4,
    )


def test_every_mode_is_a_rollout() -> None:
    parts, watch = _parts(), cast(PhaseWatch, object())
    modes = [
        SingleTurnRollout(parts),
        RefillRollout(parts, max_rounds=2, watch=watch),
        EpisodeRollout(parts, runner=cast(Any, object())),
    ]
    assert all(isinstance(mode, Rollout) for mode in modes)


@pytest.mark.parametrize(
    ("flags", "mode"),
    [([], SingleTurnRollout), (["--dynamic_sampling", "--max_num_gen_batches=3"], RefillRollout)],
)
def test_the_builder_picks_the_mode_the_config_names(flags: list[str], mode: type) -> None:
    config = config_from_args([*MODEL, *flags])
    rollout = _rollout(config, _parts(), cast(Any, None), cast(PhaseWatch, object()))
    assert type(rollout) is mode
    if isinstance(rollout, RefillRollout):
        assert rollout.max_rounds == 3


def test_rollout_seeds_are_shared_by_a_tp_group_and_distinct_across_steps_and_rounds() -> None:
    seeds = [RolloutSeeds(seed=7, rank=rank, tp_size=2) for rank in range(4)]
    # (seed * 1_000_003 + step) * 4096 + the TP group's first rank, by hand for step 5
    assert [s(5) for s in seeds] == [(7 * 1_000_003 + 5) * 4096 + leader for leader in (0, 0, 2, 2)]
    first = seeds[0](5)
    assert seeds[0](5, round_index=1) == continuation_seed(first + (1 << 62))
    drawn = {s(step, r) for s in seeds for step in range(3) for r in range(3)}
    assert len(drawn) == 2 * 3 * 3  # two TP groups, three steps, three rounds
