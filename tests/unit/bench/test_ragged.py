"""The ragged variant's forced lengths: their distribution against the log-uniform law, their
independence from anything but seed, call and position, and the engine wrapper that forces them
through per-request caps."""

from __future__ import annotations

import math

import torch

from lrft.api import GenerationRequest, SamplingParams
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.bench.ragged import ForcedLengths, forced_lengths
from lrft.bench.workloads import RaggedSpec
from lrft.testing.models import tiny_causal_lm

SPEC = RaggedSpec(min_tokens=64, max_tokens=1024, seed=0)


def test_lengths_are_log_uniform_between_the_bounds() -> None:
    """P(length <= x) = ln(x / 64) / ln(16) for x in [64, 1024]; 4096 draws within 5 standard
    errors at three quantiles, and the mean (1024 - 64) / ln(16) = 346.2 within 5%."""
    lengths = [length for call in range(32) for length in forced_lengths(SPEC, call, 128)]
    assert min(lengths) >= 64
    assert max(lengths) <= 1024
    for x in (128, 256, 512):
        p = math.log(x / 64) / math.log(16)
        share = sum(length <= x for length in lengths) / len(lengths)
        assert abs(share - p) <= 5 * math.sqrt(p * (1 - p) / len(lengths)), (x, share, p)
    mean = sum(lengths) / len(lengths)
    assert abs(mean - (1024 - 64) / math.log(16)) <= 0.05 * mean, mean


def test_lengths_depend_on_seed_call_and_position_only() -> None:
    assert forced_lengths(SPEC, 3, 128) == forced_lengths(SPEC, 3, 128)
    assert forced_lengths(SPEC, 3, 16) == forced_lengths(SPEC, 3, 128)[:16]
    assert forced_lengths(SPEC, 3, 128) != forced_lengths(SPEC, 4, 128)
    other = RaggedSpec(min_tokens=64, max_tokens=1024, seed=1)
    assert forced_lengths(other, 3, 128) != forced_lengths(SPEC, 3, 128)


def test_the_wrapper_forces_each_response_and_keeps_the_results_request_major() -> None:
    torch.set_num_threads(1)
    spec = RaggedSpec(min_tokens=1, max_tokens=9, seed=2)
    engine = HFRolloutEngine(
        tiny_causal_lm(0), config=HFEngineConfig(device="cpu", decode="static", max_batch_size=3)
    )
    forced = ForcedLengths(engine, spec)
    requests = [
        GenerationRequest(prompt_token_ids=(5, 6, 7), request_id="a"),
        GenerationRequest(prompt_token_ids=(8, 9), request_id="b"),
    ]
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=9, seed=0)
    for call in range(2):
        results = forced.generate(requests, params)
        assert [(r.request_id, r.sample_index) for r in results] == [
            (request_id, sample) for request_id in "ab" for sample in range(3)
        ]
        lengths = [len(r.output_token_ids) for r in results]
        assert lengths == forced_lengths(spec, call, 6)
        assert forced.lengths[call] == lengths
    assert len(set(forced.lengths[0])) > 1, "a weak test: every length equal"
