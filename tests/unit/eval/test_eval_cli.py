"""``lrft eval``'s command line: lrft train's guard holds here too (no value of a switch or of an
unknown flag is shown), the shared flags parse to the settings ``lrft train`` would read, and a
finished run leaves no process group behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.distributed as dist

from lrft.cli import main
from lrft.cli.eval import settings_from_args
from tests.trainer.fixtures import make_model_folder

SECRET = "hf-token-5be0d2"
BASE = ["eval", "--model=m", "--dataset=d.jsonl"]


@pytest.mark.parametrize(
    "extra",
    [["--apply_chat_template", SECRET], [f"--unknown_key={SECRET}"], ["--greedy", SECRET]],
)
def test_a_value_after_a_switch_or_an_unknown_flag_is_never_shown(
    extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*BASE, *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert SECRET not in err
    assert "configuration error" in err


def test_own_and_shared_settings() -> None:
    settings, shared = settings_from_args(
        [*BASE, "--n_samples=4", "--no-greedy", "--temperature=0.7", "--apply_chat_template"]
    )
    assert (settings.n_samples, settings.ks, settings.greedy) == (4, (1, 4), False)
    assert shared == {"temperature": 0.7, "apply_chat_template": True}


def test_a_finished_run_closes_its_process_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    ):
        monkeypatch.delenv(name, raising=False)  # what the run sets for its one rank is undone
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+1=", "label": "x"}) + "\n" for a in (3, 5)))
    report = tmp_path / "report.json"
    model = make_model_folder(tmp_path / "model")
    args = [f"--model={model}", f"--dataset={data}", "--input_key=prompt", "--label_key=label"]
    args += ["--reward_fn=tests.trainer.fixtures:digit_fraction", "--generate_max_len=2"]
    assert main(["eval", *args, f"--output={report}"]) == 0
    assert json.loads(report.read_text())["metrics"]["prompts"] == 2  # the run ran to its end
    assert not dist.is_initialized()  # a peer could otherwise abort on tearing it down at exit
