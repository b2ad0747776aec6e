"""The output check with a process group (a trainer built by hand): rank 0 decides for every
rank, and only rank 0 removes."""

from __future__ import annotations

from pathlib import Path

import torch.distributed as dist

from lrft.api.errors import ConfigError
from lrft.config import TrainConfig
from lrft.run.outputs import claim_outputs, own_outputs
from lrft.testing.distributed import DistributedSuite, RankPool, current_rank_context


def _verdicts(root: Path) -> list[str | None]:
    rank = current_rank_context().rank
    # Rank 1 is given a folder that looks empty to it: rank 0's view decides for both.
    save = root / ("out" if rank == 0 else "looks_empty")
    config = TrainConfig(pretrain="m", prompt_data="p", reward_fn="math", save_path=str(save))
    if rank == 0:
        save.mkdir(parents=True)
        (save / "metrics.jsonl").write_text("{}\n")
    dist.barrier()
    verdicts: list[str | None] = []
    try:
        claim_outputs(config, rank=rank)
        verdicts.append(None)
    except ConfigError as error:
        verdicts.append(str(error).split(":")[0])
    replace = TrainConfig(
        pretrain="m",
        prompt_data="p",
        reward_fn="math",
        save_path=str(root / "out"),
        overwrite_output=True,
    )
    verdicts.append(claim_outputs(replace, rank=rank))
    verdicts.append(str((root / "out" / "metrics.jsonl").exists()))
    run_id = own_outputs(root / "out", None, rank=rank)
    verdicts.append(str(len(run_id)))
    gathered: list[object] = [None, None]
    dist.all_gather_object(gathered, run_id)
    verdicts.append(str(gathered[0] == gathered[1]))
    return verdicts


class TestOutputsRanks(DistributedSuite):
    world_size = 2

    def test_rank_zero_decides_removes_and_draws_the_run_id(
        self, pool: RankPool, tmp_path: Path
    ) -> None:
        root = pool.shared_dir / tmp_path.name
        first, second = pool.run(_verdicts, root)
        refused = f"save_path {root / 'out'} already holds the outputs of another run"
        assert first[0] == second[0] == refused
        assert first[1] == f"overwrite_output: removed metrics.jsonl from {root / 'out'}"
        assert second[1] is None
        assert first[2:] == second[2:] == ["False", "16", "True"]
