"""The ragged variant's ends: the law they follow, the rule that draws them inside the model's
sampling, and an engine that learns them from its own stop checks."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from transformers import GenerationConfig

from lrft.api import GenerationRequest, SamplingParams
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.bench.ragged import EndDraw, RecordedLengths, expected_length, hazards, length_law
from lrft.bench.workloads import RaggedSpec
from lrft.testing.models import VOCAB_SIZE, tiny_causal_lm

SPEC = RaggedSpec(min_tokens=64, max_tokens=1024, seed=0)
EOS = 2  # the tiny model's


def test_the_law_is_log_uniform_between_the_bounds() -> None:
    """P(length <= x) = ln((x + 0.5) / 64) / ln(16) (rounding a log-uniform variable), and the
    mean is close to the continuous law's (1024 - 64) / ln(16) = 346.2."""
    law = length_law(SPEC)
    assert math.isclose(sum(law), 1.0, abs_tol=1e-12)
    assert sum(law[:64]) == 0.0
    for x in (64, 100, 256, 777):
        assert math.isclose(sum(law[: x + 1]), math.log((x + 0.5) / 64) / math.log(16))
    assert abs(expected_length(SPEC) - (1024 - 64) / math.log(16)) < 0.5


def test_the_hazards_give_back_the_law() -> None:
    """P(L = j) = h(j) * prod_{i < j} (1 - h(i))."""
    law, table = length_law(SPEC), hazards(SPEC)
    survived = 1.0
    for j, h in enumerate(table):
        assert math.isclose(h * survived, law[j], abs_tol=1e-12), j
        survived *= 1 - h
    assert table[-1] == 1.0


def test_rows_fed_random_tokens_end_by_the_law() -> None:
    """20 000 rows stepped by the rule alone, each fed a uniformly random token per step (what
    a random model's sampling gives): the lengths' distribution at three quantiles within 5
    standard errors of the law, the mean within 2%."""
    spec = RaggedSpec(min_tokens=4, max_tokens=64, seed=3)
    prompt = 7
    draw = EndDraw(
        spec, vocab_size=VOCAB_SIZE, prompt_tokens=prompt, eos_token_id=EOS, device="cpu"
    )
    rows = 20_000
    generator = torch.Generator().manual_seed(11)
    length = torch.zeros(rows, dtype=torch.long)
    # the token fed before token j sits at position prompt + j - 2
    for j in range(1, spec.max_tokens + 1):
        fed = torch.randint(0, VOCAB_SIZE, (rows, 1), generator=generator)
        positions = torch.full((rows, 1), prompt + j - 2)
        ends = draw.ends(fed, positions)[:, 0] & (length == 0)
        length[ends] = j
    assert int(length.min()) >= spec.min_tokens
    assert int(length.max()) <= spec.max_tokens
    law = length_law(spec)
    for x in (8, 16, 32):
        p = sum(law[: x + 1])
        share = float((length <= x).double().mean())
        assert abs(share - p) <= 5 * math.sqrt(p * (1 - p) / rows), (x, share, p)
    mean = float(length.double().mean())
    assert abs(mean - expected_length(spec)) <= 0.02 * expected_length(spec)


def _rule_length(
    draw: EndDraw, prompt: list[int], completion: list[int], max_tokens: int
) -> int | None:
    """Where the rule ends ``completion`` (1-based), computed token by token on the host from
    the draw's tables, or ``None`` when it would not end within ``max_tokens``."""
    hazard = hazards(draw.spec)
    fed = prompt[-1]
    for j in range(1, max_tokens + 1):
        index = min(max(len(prompt) + j - 2 - draw.prompt_tokens + 2, 0), draw.spec.max_tokens)
        u = (float(draw.token_uniform[fed]) + float(draw.step_uniform[index])) % 1.0
        if u < hazard[index]:
            return j
        if j > len(completion):
            return None
        fed = completion[j - 1]
    return None


def _first_eos(row: list[int]) -> int | None:
    return row.index(EOS) + 1 if EOS in row else None


def test_the_hook_ends_transformers_generate_where_the_rule_says() -> None:
    torch.manual_seed(0)
    spec = RaggedSpec(min_tokens=2, max_tokens=10, seed=1)
    model: Any = tiny_causal_lm(0)  # its generate is transformers' untyped one
    prompts = torch.randint(3, VOCAB_SIZE, (6, 5))
    draw = EndDraw(spec, vocab_size=VOCAB_SIZE, prompt_tokens=5, eos_token_id=EOS, device="cpu")
    handle = draw.attach(model)
    config = GenerationConfig(  # type: ignore[no-untyped-call]  # unannotated in transformers
        max_new_tokens=12, do_sample=True, eos_token_id=EOS, pad_token_id=0
    )
    output = model.generate(input_ids=prompts, generation_config=config)[:, 5:].tolist()
    lengths = []
    for prompt, row in zip(prompts.tolist(), output, strict=True):
        expected = _rule_length(draw, prompt, row, 12)
        assert expected is not None
        assert expected <= spec.max_tokens
        assert _first_eos(row) == expected, (row, expected)
        lengths.append(expected)
    assert len(set(lengths)) > 1, "a weak test: every row ended at the same step"
    draw.enabled.fill_(False)  # switched off: the rows run on (a random model's EOS is rare)
    output = model.generate(input_ids=prompts, generation_config=config)[:, 5:]
    assert sum(_first_eos(row) is None for row in output.tolist()) >= 5
    handle.remove()


@pytest.mark.parametrize("decode", ["static", "generate"])
def test_the_engine_learns_the_drawn_ends_from_its_stop_ids(decode: str) -> None:
    """The hf engine, hooked as ``lrft bench`` hooks it: every response ends with EOS where the
    rule puts it, reported as a stop, with the requests passed through as they were."""
    torch.set_num_threads(1)
    spec = RaggedSpec(min_tokens=2, max_tokens=9, seed=2)
    engine = HFRolloutEngine(
        tiny_causal_lm(0), config=HFEngineConfig(device="cpu", decode=decode, max_batch_size=3)
    )
    draw = EndDraw(spec, vocab_size=VOCAB_SIZE, prompt_tokens=3, eos_token_id=EOS, device="cpu")
    draw.attach(engine.model)
    recorded = RecordedLengths(engine)
    requests = [
        GenerationRequest(prompt_token_ids=(5, 6, 7), request_id="a"),
        GenerationRequest(prompt_token_ids=(8, 9, 10), request_id="b"),
    ]
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=12, stop_token_ids=(EOS,), seed=0)
    results = recorded.generate(requests, params)
    assert [(r.request_id, r.sample_index) for r in results] == [
        (request_id, sample) for request_id in "ab" for sample in range(3)
    ]
    for result in results:
        prompt = list(requests[0 if result.request_id == "a" else 1].prompt_token_ids)
        tokens = list(result.output_token_ids)
        assert len(tokens) == _rule_length(draw, prompt, tokens, 12)
        assert tokens[-1] == EOS
        assert result.finish_reason == "stop"
    assert recorded.generated == [[len(r.output_token_ids) for r in results]]
    assert recorded.stopped == [[True] * 6]
    assert len(set(recorded.generated[0])) > 1, "a weak test: every length equal"
