"""``--hf_decode`` reaches the hf engine the trainer builds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lrft.backends.rollout.hf import HFRolloutEngine
from lrft.cli import config_from_args
from lrft.dist import RankInfo
from lrft.trainer.components import rollout_engine
from tests.trainer.fixtures import make_model_folder

INFO = RankInfo(rank=0, local_rank=0, world_size=1, local_world_size=1, device=torch.device("cpu"))


@pytest.mark.parametrize(("flag", "path"), [([], "generate"), (["--hf_decode=static"], "static")])
def test_the_engine_decodes_on_the_chosen_path(tmp_path: Path, flag: list[str], path: str) -> None:
    model = make_model_folder(tmp_path / "model")
    args = ["train", f"--pretrain={model}", "--prompt_data=p.jsonl", "--reward_fn=math", *flag]
    engine = rollout_engine(str(model), config_from_args(args), INFO)
    try:
        assert isinstance(engine, HFRolloutEngine)
        assert engine.decode_path == path
    finally:
        engine.shutdown()
