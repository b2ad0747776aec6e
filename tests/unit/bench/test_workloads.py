"""Workloads as data: the built-in ones as specified, their model FLOPs and parameter counts
against the models transformers builds, and bad workload files named with the rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import Qwen2ForCausalLM

from lrft.api.errors import ConfigError
from lrft.bench import BUILT_IN, load_workload
from lrft.bench.assets import bench_tokenizer, prompt_ids, qwen2_config, word_token
from lrft.bench.flops import body_parameters, total_parameters, training_flops
from lrft.bench.workloads import PromptSpec


def test_w1_is_the_workload_trl_was_measured_on() -> None:
    w1 = load_workload("w1")
    model = w1.model
    assert (model.hidden_size, model.num_hidden_layers, model.intermediate_size) == (896, 24, 4864)
    assert (model.num_attention_heads, model.num_key_value_heads) == (14, 2)
    assert (model.vocab_size, model.tie_word_embeddings, model.seed) == (32768, True, 0)
    assert model.saved_dtype == "bfloat16"
    assert w1.grpo is not None
    train = w1.grpo.train
    assert train["rollout_batch_size"] * train["n_samples_per_prompt"] == 64
    assert train["n_samples_per_prompt"] == 8
    assert train["generate_max_len"] == 256
    assert (train["temperature"], train["init_kl_coef"], train["actor_learning_rate"]) == (
        1.0,
        0.0,
        1e-6,
    )
    assert train["train_batch_size"] == 64
    assert train["max_epochs"] == 1
    assert w1.grpo.prompts.tokens == 32
    assert (w1.grpo.steps, w1.grpo.steady_from) == (6, 3)
    assert round(total_parameters(model) / 1e6) == 387


def test_w2_is_the_workload_trl_w2_was_measured_on() -> None:
    """The constants of the TRL reference script for W2: the Qwen2.5-1.5B shape, 16 prompts x 8
    generations of 1024 tokens, prompts of 128 tokens, micro-batches of 16, one optimizer step
    per 128 completions, 4 steps with the medians of steps 2-4."""
    w2 = load_workload("w2")
    model = w2.model
    assert (model.hidden_size, model.num_hidden_layers, model.intermediate_size) == (1536, 28, 8960)
    assert (model.num_attention_heads, model.num_key_value_heads) == (12, 2)
    assert (model.vocab_size, model.tie_word_embeddings, model.saved_dtype) == (
        151936,
        True,
        "bfloat16",
    )
    assert w2.grpo is not None
    train = w2.grpo.train
    assert train["rollout_batch_size"] * train["n_samples_per_prompt"] == 128
    assert (train["generate_max_len"], train["micro_train_batch_size"]) == (1024, 16)
    assert train["train_batch_size"] == 128
    assert (train["init_kl_coef"], train["actor_learning_rate"]) == (0.0, 1e-6)
    assert w2.grpo.prompts.tokens == 128
    assert (w2.grpo.steps, w2.grpo.steady_from) == (4, 2)
    assert round(total_parameters(model) / 1e7) == 154


@pytest.mark.parametrize("name", BUILT_IN)
def test_parameter_count_equals_the_transformers_model(name: str) -> None:
    spec = load_workload(name).model
    with torch.device("meta"):
        model = Qwen2ForCausalLM(qwen2_config(spec))
    assert total_parameters(spec) == sum(p.numel() for p in model.parameters())
    layers = sum(p.numel() for p in model.model.layers.parameters())
    assert body_parameters(spec) == layers + model.model.norm.weight.numel()


def test_w2_ragged_is_w2_with_ragged_ends() -> None:
    w2, ragged = load_workload("w2"), load_workload("w2-ragged")
    assert ragged.model == w2.model
    assert w2.grpo is not None
    assert ragged.grpo is not None
    assert (ragged.grpo.prompts, ragged.grpo.train) == (w2.grpo.prompts, w2.grpo.train)
    assert (ragged.grpo.steps, ragged.grpo.steady_from) == (w2.grpo.steps, w2.grpo.steady_from)
    assert ragged.grpo.ragged is not None
    spec = ragged.grpo.ragged
    assert (spec.min_tokens, spec.max_tokens) == (64, w2.grpo.train["generate_max_len"])
    assert w2.grpo.ragged is None


def test_qwen2_1p5b_has_the_published_size() -> None:
    assert round(total_parameters(load_workload("qwen2-1.5b").model) / 1e9, 2) == 1.54


def test_training_flops_by_hand() -> None:
    spec = load_workload("tiny").model  # hidden 64, 2 layers, intermediate 128, vocab 512
    layer = (64 * 64 + 64) + 2 * (64 * 32 + 32) + 64 * 64 + 3 * 64 * 128 + 2 * 64
    body = 2 * layer + 64
    expected = 6 * body * 10 + 6 * 512 * 64 * 4 + 6 * 2 * 64 * 10**2
    assert training_flops(spec, sequence_tokens=10, response_tokens=4) == expected


def test_prompts_round_trip_through_the_benchmark_tokenizer() -> None:
    tokenizer = bench_tokenizer(600)
    for ids in prompt_ids(PromptSpec(count=4, tokens=9, seed=3), 600):
        text = "".join(word_token(i) for i in ids)
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == ids


def _write(path: Path, **changes: object) -> str:
    data = json.loads(
        (Path(__file__).parents[3] / "src/lrft/bench/workloads/tiny.json").read_text()
    )
    for dotted, value in changes.items():
        target = data
        *parents, key = dotted.split("__")
        for parent in parents:
            target = target[parent]
        if value is None:
            del target[key]
        else:
            target[key] = value
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"bogus": 1}, r"has unknown keys \['bogus'\]"),
        ({"grpo__train__pretrain": "x"}, r"grpo.train must not set \['pretrain'\]"),
        ({"grpo__steady_from": 9}, r"grpo.steady_from 9 must be <= grpo.steps 3"),
        ({"model__hidden_size": 0}, r"hidden_size must be a positive integer, got 0"),
        ({"model__num_attention_heads": 5}, r"hidden_size 64 must be divisible by num_attention"),
        ({"model__saved_dtype": "float16"}, r"saved_dtype must be 'bfloat16' or 'float32'"),
        ({"train_mfu__sequences": 3}, r"sequences 3 must be a multiple of .*micro_train_batch"),
        ({"model__vocab_size": None}, r"missing 1 required keyword-only argument: 'vocab_size'"),
        (
            {"grpo__ragged": {"min_tokens": 9, "max_tokens": 4}},
            r"grpo.ragged.min_tokens 9 must be <= grpo.ragged.max_tokens 4",
        ),
        (
            {"grpo__ragged": {"min_tokens": 2, "max_tokens": 9}},
            r"grpo.ragged.max_tokens 9 must be <= grpo.train.generate_max_len 8",
        ),
    ],
)
def test_bad_workloads_are_named(tmp_path: Path, changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_workload(_write(tmp_path / "w.json", **changes))


def test_unknown_workload_names_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"'nope' is neither a built-in one \(w1, w2, qwen2-1.5b"):
        load_workload("nope")


def test_all_gather_seconds_counts_the_bytes_a_rank_receives() -> None:
    from lrft.bench.sync import all_gather_seconds

    # 4 GB over 2 ranks: each receives the 2 GB it lacks, at 100 GB/s of bus bandwidth
    assert all_gather_seconds(4_000_000_000, 2, 100.0) == pytest.approx(0.02)
    assert all_gather_seconds(4_000_000_000, 4, 100.0) == pytest.approx(0.03)
