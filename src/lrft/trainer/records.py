"""What a training run records: its metrics (JSONL, TensorBoard, W&B), its console, and the
sampled trajectories; rank 0 writes the metrics and the console, every rank its trajectories."""

from __future__ import annotations

from pathlib import Path

import attrs

from lrft.config import TrainConfig
from lrft.run.metrics import MetricsWriter
from lrft.run.outputs import TRAJECTORY_DIR
from lrft.run.progress import Console
from lrft.run.wandb_metrics import DEFAULT_PROJECT, WandbMetrics, WandbSettings
from lrft.trainer.trajectories import TrajectoryWriter


@attrs.frozen(kw_only=True, eq=False)
class RunRecords:
    metrics: MetricsWriter
    console: Console
    trajectories: TrajectoryWriter | None

    @classmethod
    def for_run(cls, config: TrainConfig, rank: int) -> RunRecords:
        save_path = Path(config.save_path)
        wandb = _wandb(config) if config.use_wandb and rank == 0 else None
        return cls(
            metrics=MetricsWriter(
                save_path, enabled=rank == 0, tensorboard=config.use_tensorboard, wandb=wandb
            ),
            console=Console(enabled=rank == 0, progress_bar=config.progress_bar),
            trajectories=(
                TrajectoryWriter(
                    save_path / TRAJECTORY_DIR, every=config.save_trajectories_steps or 1, rank=rank
                )
                if config.save_trajectories
                else None
            ),
        )


def _wandb(config: TrainConfig) -> WandbMetrics:
    settings = WandbSettings(
        directory=Path(config.save_path),
        project=config.wandb_project or DEFAULT_PROJECT,
        entity=config.wandb_org,
        group=config.wandb_group,
        name=config.wandb_run_name,
    )
    return WandbMetrics(settings, config=config.as_dict())
