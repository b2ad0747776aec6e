"""This process's place in a torchrun job, read from the environment torchrun sets."""

from __future__ import annotations

import os
from collections.abc import Mapping

import attrs
import torch

from lrft.api.errors import ConfigError

_TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


@attrs.frozen(kw_only=True)
class RankInfo:
    """Rank, local rank and sizes of this process, and the device it computes on."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device

    def __attrs_post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank {self.rank} is outside [0, world_size={self.world_size})")
        if not 0 <= self.local_rank < self.local_world_size:
            raise ConfigError(
                f"local_rank {self.local_rank} is outside "
                f"[0, local_world_size={self.local_world_size})"
            )
        if self.world_size % self.local_world_size:
            raise ConfigError(
                f"world_size {self.world_size} is not a multiple of local_world_size "
                f"{self.local_world_size}"
            )

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, *, device: str | torch.device | None = None
    ) -> RankInfo:
        """Read torchrun's variables; ``device`` defaults to ``cuda:LOCAL_RANK`` when CUDA is
        available, else the CPU."""
        env = os.environ if env is None else env
        missing = [name for name in _TORCHRUN_VARIABLES if name not in env]
        if missing:
            raise ConfigError(
                f"environment variable(s) {', '.join(missing)} not set: run under torchrun "
                "(torchrun --nproc_per_node N -m lrft ...) or set them for a single process "
                "(RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1)"
            )
        values: dict[str, int] = {}
        for name in _TORCHRUN_VARIABLES:
            try:
                values[name] = int(env[name])
            except ValueError:
                raise ConfigError(f"environment variable {name}={env[name]!r} is not an integer") from None
        local_rank = values["LOCAL_RANK"]
        if device is None:
            device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
        return cls(
            rank=values["RANK"],
            local_rank=local_rank,
            world_size=values["WORLD_SIZE"],
            local_world_size=values["LOCAL_WORLD_SIZE"],
            device=torch.device(device),
        )
