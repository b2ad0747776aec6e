"""``lrft bench train-mfu`` on ragged responses runs the policy update padded and packed side by
side and reports both; its rows have the forced lengths and its padding fraction is the padded
forwards' share of padding. A smoke test of the benchmark: no figure is held to a threshold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lrft.api.errors import ConfigError
from lrft.bench import load_workload
from lrft.bench.ragged import drawn_lengths
from lrft.bench.train_packing import ragged_experience
from lrft.bench.workloads import workload_from_dict
from lrft.trainer.replay import ReplayBuffer
from tests.bench.test_bench_smoke import _bench, _positive


def _tiny_ragged(tmp_path: Path) -> Path:
    tiny = load_workload("tiny").as_dict()
    tiny["name"] = "tiny-ragged-train"
    for part in ("grpo", "sync", "sleep"):
        tiny[part] = None
    tiny["train_mfu"].update(
        {
            "sequences": 4,
            "response_tokens": 12,
            "micro_train_batch_size": 4,
            "ragged": {"min_tokens": 2, "max_tokens": 12, "seed": 3},
        }
    )
    path = tmp_path / "tiny-ragged-train.json"
    path.write_text(json.dumps(tiny))
    return path


def test_ragged_rows_have_the_drawn_lengths_and_no_tokens_past_them() -> None:
    spec = load_workload("cpu-ragged").train_mfu
    assert spec is not None
    assert spec.ragged is not None
    batch = ragged_experience(spec, 512, rank=1)
    sequences = batch.sequences
    expected = drawn_lengths(spec.ragged, 1, spec.sequences)
    assert sequences.action_mask.sum(-1).tolist() == expected
    assert (sequences.attention_mask.sum(-1) == spec.prompt_tokens + torch.tensor(expected)).all()
    assert bool((sequences.input_ids[sequences.attention_mask == 0] == 0).all())
    assert bool((batch.advantages[~sequences.action_mask] == 0).all())


def test_the_benchmark_reports_both_layouts_and_the_padding(tmp_path: Path) -> None:
    workload = _tiny_ragged(tmp_path)
    document = _bench(["train-mfu", "--steps=2"], tmp_path, workload=str(workload))
    train = document["train_mfu"]
    for side in ("padded", "packed"):
        assert len(train[side]["step_seconds"]) == 2
        assert _positive(train[side]["train_tokens_per_s"])
    assert _positive(train["packed_speedup"])
    spec = load_workload(str(workload)).train_mfu
    assert spec is not None
    batch = ragged_experience(spec, 512, rank=0)
    lengths = batch.sequences.attention_mask.sum(-1)
    buffer = ReplayBuffer(seed=0)
    buffer.append(batch)
    assert len(buffer.row_groups(4, epoch=0)) == 1  # one micro-batch of all four rows
    assert train["real_tokens_per_step"] == float(lengths.sum())
    assert train["padded_tokens_per_step"] == 4.0 * float(lengths.max())
    assert train["padding_fraction"] == pytest.approx(
        1 - float(lengths.sum()) / (4 * float(lengths.max()))
    )


def test_ragged_lengths_must_fit_the_rows() -> None:
    tiny = load_workload("tiny").as_dict()
    tiny["train_mfu"]["ragged"] = {"min_tokens": 2, "max_tokens": 9}
    with pytest.raises(ConfigError, match=r"train_mfu.ragged.max_tokens 9 must be <= train_mfu"):
        workload_from_dict(tiny, source="test")
