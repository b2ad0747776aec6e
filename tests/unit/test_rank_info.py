"""RankInfo from torchrun's environment: values, device choice and errors that name the variable."""

from __future__ import annotations

import pytest
import torch

from lrft.api import ConfigError
from lrft.dist import RankInfo, backend_for


def _env(**overrides: str) -> dict[str, str]:
    env = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}
    env.update(overrides)
    return env


def test_reads_torchrun_variables() -> None:
    info = RankInfo.from_env(_env(), device="cpu")
    assert (info.rank, info.local_rank, info.world_size, info.local_world_size) == (3, 1, 4, 2)
    assert info.device == torch.device("cpu")


def test_default_device_follows_cuda_availability() -> None:
    info = RankInfo.from_env(_env())
    expected = torch.device("cuda", 1) if torch.cuda.is_available() else torch.device("cpu")
    assert info.device == expected


def test_missing_variable_is_named() -> None:
    env = _env()
    del env["LOCAL_WORLD_SIZE"]
    with pytest.raises(ConfigError, match="LOCAL_WORLD_SIZE not set"):
        RankInfo.from_env(env)


def test_non_integer_variable_is_named() -> None:
    with pytest.raises(ConfigError, match="WORLD_SIZE='four' is not an integer"):
        RankInfo.from_env(_env(WORLD_SIZE="four"))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"RANK": "4"}, r"rank 4 is outside \[0, world_size=4\)"),
        ({"LOCAL_RANK": "2"}, r"local_rank 2 is outside \[0, local_world_size=2\)"),
        ({"LOCAL_WORLD_SIZE": "3", "LOCAL_RANK": "0"}, "not a multiple of local_world_size 3"),
    ],
)
def test_inconsistent_values_raise(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RankInfo.from_env(_env(**overrides), device="cpu")


def test_backend_follows_device() -> None:
    assert backend_for(torch.device("cpu")) == "gloo"
    assert backend_for(torch.device("cuda", 0)) == "nccl"
