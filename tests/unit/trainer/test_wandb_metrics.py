"""W&B logging through the real wandb package, offline: the run's transaction log, read back by
wandb's own reader, holds the config and exactly the values the metrics JSONL holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from lrft.api.errors import ConfigError
from lrft.cli import config_from_args, main
from lrft.config import TrainConfig
from lrft.run.metrics import MetricsWriter, read_metrics
from lrft.run.wandb_metrics import WandbMetrics, WandbSettings, new_run_id
from tests.trainer.wandb_offline import OFFLINE_ENV, history, offline_runs, only, read_records

pytest.importorskip("wandb", reason="needs wandb (pip install 'lrft[wandb]')")

MODEL = ["train", "--pretrain=m", "--prompt_data=p.jsonl", "--reward_fn=math"]
CONFIG = {"seed": 7, "actor_learning_rate": 0.001, "advantage_estimator": "group_norm"}
RECORDS: list[tuple[int, str, dict[str, float]]] = [
    (0, "eval", {"eval/accuracy": 0.125, "eval/reward_mean": 0.1875}),
    (1, "train", {"train/reward_mean": 0.25, "time/step_s": 1.7, "memory/policy_mb": 812.3}),
    (2, "train", {"train/reward_mean": 0.5, "time/step_s": 1.6, "memory/policy_mb": 813.9}),
    (2, "eval", {"eval/accuracy": 0.375, "eval/reward_mean": 0.4}),
    (3, "train", {"train/reward_mean": 1 / 3, "time/step_s": 1.5, "memory/policy_mb": 815.0}),
]


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in OFFLINE_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("WANDB_DIR", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def _writer(save: Path, run_id: str | None = None) -> MetricsWriter:
    settings = WandbSettings(directory=save, project="proj", entity="team", group="g", name="n")
    sink = WandbMetrics(settings, config=CONFIG)
    if run_id is not None:
        sink.continue_run(run_id)
    return MetricsWriter(save, enabled=True, tensorboard=False, wandb=sink)


def _jsonl_rows(path: Path) -> dict[int, dict[str, float]]:
    """The JSONL records merged by step (W&B keeps one row per step)."""
    rows: dict[int, dict[str, float]] = {}
    for record in read_metrics(path):
        values = {k: v for k, v in record.items() if k not in ("step", "kind")}
        rows.setdefault(record["step"], {}).update(values)
    return rows


def test_offline_run_holds_the_config_and_every_metric_of_the_jsonl(tmp_path: Path) -> None:
    writer = _writer(tmp_path)
    for step, kind, values in RECORDS:
        writer.log(step, kind, values)
    assert writer.wandb is not None
    run_id = writer.wandb.run_id
    writer.close()

    (run_dir,) = offline_runs(tmp_path / "wandb")
    records = read_records(run_dir)
    assert history(records) == _jsonl_rows(writer.path)
    assert sorted(history(records)) == [0, 1, 2, 3]
    run = only(records, "run")
    assert (run["run_id"], run["project"], run["entity"]) == (run_id, "proj", "team")
    assert (run["run_group"], run["display_name"]) == ("g", "n")
    config = {k: v for k, v in run["config"]["update"].items() if not k.startswith("_")}
    assert config == CONFIG
    assert only(records, "exit")["exit_code"] == 0


def test_a_failed_run_is_finished_as_failed(tmp_path: Path) -> None:
    writer = _writer(tmp_path)
    writer.log(1, "train", {"train/reward_mean": 0.5})
    writer.close(failed=True)

    (run_dir,) = offline_runs(tmp_path / "wandb")
    assert only(read_records(run_dir), "exit")["exit_code"] == 1


def test_a_resumed_writer_continues_the_same_run(tmp_path: Path) -> None:
    first = _writer(tmp_path)
    first.log(1, "train", {"train/reward_mean": 0.25})
    first.log(2, "train", {"train/reward_mean": 0.5})
    assert first.wandb is not None
    run_id = first.wandb.run_id
    first.close()
    resumed = _writer(tmp_path, run_id=run_id)
    resumed.log(3, "train", {"train/reward_mean": 0.75})
    resumed.close()

    runs = offline_runs(tmp_path / "wandb")
    assert len(runs) == 2  # offline, each process writes its own file of the run
    ids = [only(read_records(run), "run")["run_id"] for run in runs]
    assert ids == [run_id, run_id]
    assert only(read_records(runs[1]), "run")["resume"] is True
    assert history(read_records(runs[1])) == {3: {"train/reward_mean": 0.75}}


def test_a_started_run_cannot_switch_ids(tmp_path: Path) -> None:
    writer = _writer(tmp_path)
    assert writer.wandb is not None
    writer.wandb.start()
    with pytest.raises(RuntimeError, match="already started"):
        writer.wandb.continue_run("abcdefgh")
    writer.close()


def test_a_run_that_cannot_start_says_how_to_give_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import wandb

    def refuse(**_: object) -> None:  # what wandb.init raises online without an API key
        raise wandb.errors.UsageError("No API key configured. Use `wandb login` to log in.")

    monkeypatch.setattr(wandb, "init", refuse)
    sink = WandbMetrics(WandbSettings(directory=tmp_path), config={})
    with pytest.raises(ConfigError, match=r"No API key configured.*WANDB_API_KEY.*offline"):
        sink.start()
    assert not sink.started


def test_other_ranks_log_nothing(tmp_path: Path) -> None:
    settings = WandbSettings(directory=tmp_path)
    writer = MetricsWriter(
        tmp_path, enabled=False, tensorboard=False, wandb=WandbMetrics(settings, config={})
    )
    writer.log(1, "train", {"a": 1.0})
    writer.close()
    assert writer.wandb is None
    assert not (tmp_path / "wandb").exists()


def test_run_ids_look_like_wandb_ids() -> None:
    ids = {new_run_id() for _ in range(50)}
    assert len(ids) == 50
    assert all(len(i) == 8 and i.isalnum() and i == i.lower() for i in ids)


def test_missing_wandb_is_refused_before_starting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("lrft.extras.wandb_available", lambda: False)
    with pytest.raises(ConfigError, match=r"use_wandb needs the wandb package.*lrft\[wandb\]"):
        TrainConfig(use_wandb=True)
    assert main([*MODEL, "--use_wandb"]) == 2
    assert "pip install 'lrft[wandb]'" in capsys.readouterr().err
    import torch.distributed as dist

    assert not dist.is_initialized()


def test_a_key_in_use_wandb_is_refused_without_being_echoed() -> None:
    secret = "0123456789abcdef0123456789abcdef01234567"
    with pytest.raises(ConfigError, match="WANDB_API_KEY") as caught:
        TrainConfig(use_wandb=secret)  # type: ignore[arg-type]  # what a LightRFT config holds
    assert secret not in str(caught.value)


@pytest.mark.parametrize("flag", ["wandb_project", "wandb_org", "wandb_group", "wandb_run_name"])
def test_wandb_settings_need_use_wandb(flag: str) -> None:
    with pytest.raises(ConfigError, match=rf"{flag} 'x' needs use_wandb"):
        config_from_args([*MODEL, f"--{flag}=x"])
    assert getattr(config_from_args([*MODEL, "--use_wandb", f"--{flag}=x"]), flag) == "x"
