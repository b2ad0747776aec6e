"""The hf engine's static loop with rows that finish at different lengths, on CPU: refilled and
compacted rows against plain transformers, the work finished rows stop costing, seeds, and
per-request token caps.

References are independent of the loop: ``lrft.testing.reference`` (a full forward per token,
``log_softmax`` of a full forward) and a hand-written greedy decode with stop ids.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import pytest
import torch

from lrft.api import GenerationRequest, SamplingParams
from lrft.backends.rollout._hf_decode import LIVE_BUCKET, DecodeOutput, StaticDecoder
from lrft.backends.rollout._hf_rows import RowPlan, row_buckets
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.testing.models import VOCAB_SIZE, tiny_causal_lm
from lrft.testing.reference import token_logprobs

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)  # tiny models: one thread is fastest on shared cores


@pytest.fixture(scope="module")
def reference() -> torch.nn.Module:
    return tiny_causal_lm(0)


def _prompts(count: int, seed: int = 0) -> list[tuple[int, ...]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 10, (count,), generator=generator).tolist()
    return [
        tuple(torch.randint(3, VOCAB_SIZE, (n,), generator=generator).tolist()) for n in lengths
    ]


@torch.no_grad()
def _greedy(
    model: torch.nn.Module,
    prompt: Sequence[int],
    limit: int,
    stops: Sequence[int] = (),
    min_new: int = 0,
) -> list[int]:
    """Greedy by hand: a full forward per token, stop ids masked before ``min_new`` tokens,
    ending after the first stop id or ``limit`` tokens."""
    ids = list(prompt)
    for step in range(limit):
        logits = model(torch.tensor([ids])).logits[0, -1]
        if step < min_new:
            logits[list(stops)] = float("-inf")
        ids.append(int(logits.argmax()))
        if ids[-1] in stops:
            break
    return ids[len(prompt) :]


def _decoder(compiled: bool) -> StaticDecoder:
    # dynamo's ``eager`` backend: the compiled step's tracing and guards without inductor's
    # compile time
    return StaticDecoder(
        tiny_causal_lm(0), CPU, cuda_graphs=False, compile_backend="eager" if compiled else None
    )


def _outputs(output: DecodeOutput) -> list[list[int]]:
    return [output.tokens[i, :length].tolist() for i, length in enumerate(output.lengths.tolist())]


def _assert_logprobs(
    model: torch.nn.Module,
    prompts: Sequence[tuple[int, ...]],
    output: DecodeOutput,
    temperature: float = 1.0,
) -> None:
    assert output.logprobs is not None
    for i, (prompt, tokens) in enumerate(zip(prompts, _outputs(output), strict=True)):
        want = torch.tensor(token_logprobs(model, prompt, tokens, temperature))
        got = output.logprobs[i, : len(tokens)].double()
        worst = (got - want).abs().max().item()
        assert worst < 1e-4, f"sequence {i} (prompt of {len(prompt)}): logprobs differ by {worst}"


@pytest.mark.parametrize("compiled", [False, True])
def test_refilled_rows_decode_like_the_reference(
    reference: torch.nn.Module, compiled: bool
) -> None:
    """Eleven sequences through three rows: most rows are refilled, some several times, and
    sequences end by their stop id, by their own limit, or not before ``min_new_tokens``; one
    prompt is long enough that steps cross attended widths. Every sequence's tokens are the
    reference greedy decode and every logprob a full forward's ``log_softmax``."""
    long_prompt = tuple((7 * i + 3) % 250 + 1 for i in range(LIVE_BUCKET + 10))
    prompts = [*_prompts(10), long_prompt]
    limits = [7, 2, 12, 1, 5, 9, 3, 12, 4, 6, 12]
    unstopped = [_greedy(reference, p, n) for p, n in zip(prompts, limits, strict=True)]
    # the most common generated id stops some sequences early, not all
    stop = Counter(t for tokens in unstopped for t in tokens[2:]).most_common(1)[0][0]
    params = SamplingParams(
        temperature=0.0, max_new_tokens=12, min_new_tokens=2, stop_token_ids=(stop,),
        return_logprobs=True,
    )  # fmt: skip
    with torch.inference_mode():
        output = _decoder(compiled).decode(prompts, limits, 3, params)
    got = _outputs(output)
    want = [_greedy(reference, p, n, (stop,), 2) for p, n in zip(prompts, limits, strict=True)]
    assert got == want
    assert any(len(w) < n for w, n in zip(want, limits, strict=True)), "no sequence stopped"
    assert any(w != u for w, u in zip(want, unstopped, strict=True)), "min_new_tokens untested"
    assert output.prefills >= 5, f"only {output.prefills} prefills: rows were not refilled"
    _assert_logprobs(reference, prompts, output)


@pytest.mark.parametrize("compiled", [False, True])
def test_sampled_logprobs_of_refilled_and_moved_rows(
    reference: torch.nn.Module, compiled: bool
) -> None:
    """Twelve sampled sequences in eight rows: rows are refilled, then the long sequences are
    moved to the front rows and steps run over four rows. Logprobs are the contract's
    (``log_softmax(logits / T)`` before truncation) for every sequence."""
    prompts = _prompts(12, seed=1)
    limits = [2, 3, 2, 16, 2, 2, 3, 16, 2, 14, 2, 3]
    params = SamplingParams(
        temperature=0.7, top_k=20, top_p=0.9, max_new_tokens=16, seed=3, return_logprobs=True
    )
    torch.manual_seed(3)
    with torch.inference_mode():
        output = _decoder(compiled).decode(prompts, limits, 8, params)
    assert output.lengths.tolist() == limits  # no stop ids: every sequence runs to its limit
    assert output.row_steps < 8 * output.steps, "steps never ran over fewer rows"
    _assert_logprobs(reference, prompts, output, temperature=0.7)


def test_finished_rows_stop_costing_work() -> None:
    """Decode steps and the rows they ran over, counted by hand.

    Two rows, limits 8, 2, 2, 2, 8: row 0 holds the first sequence for its 7 steps; row 1 holds
    each short one for one step (a prefill gives the first token) and then the last for 7
    steps, from step 3: 10 steps of 2 rows and 4 prefills. In chunks of 2 it would take
    7 + 1 + 7 = 15 steps. Eight rows, two long sequences in rows 5 and 7: after step 0 the
    six short ones are done, the long ones move to rows 0 and 1, and 18 more steps run over
    the smallest bucket of rows, 4."""
    greedy = SamplingParams(temperature=0.0, max_new_tokens=20)
    decoder = _decoder(False)
    with torch.inference_mode():
        two = decoder.decode(_prompts(5), [8, 2, 2, 2, 8], 2, greedy)
        eight = decoder.decode(_prompts(8), [2, 2, 2, 2, 2, 20, 2, 20], 8, greedy)
    assert (two.steps, two.row_steps, two.prefills) == (10, 20, 4)
    assert (eight.steps, eight.row_steps, eight.prefills) == (19, 8 + 4 * 18, 1)


@pytest.mark.parametrize("limits", [[2, 2, 2, 2, 2, 20, 2, 20], [20, 20, 2, 2, 2, 2, 2, 2]])
def test_moved_rows_continue_where_they_were(reference: torch.nn.Module, limits: list[int]) -> None:
    """The long sequences of the eight-row case above, after their move to rows 0 and 1 (or
    with no move, when they already are there), decode the reference's tokens over 4 rows (a
    move that lost a row's cache or columns would not)."""
    prompts = _prompts(8)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=20, return_logprobs=True)
    with torch.inference_mode():
        output = _decoder(False).decode(prompts, limits, 8, greedy)
    want = [_greedy(reference, p, n) for p, n in zip(prompts, limits, strict=True)]
    assert _outputs(output) == want
    assert output.row_steps == 8 + 4 * 18
    _assert_logprobs(reference, prompts, output)


def test_seeded_results_repeat_on_every_path() -> None:
    """A seeded call with refills repeats exactly, and the compiled step (which draws the same
    random numbers in the same order) gives the eager step's samples: the results depend on
    the sequences, settings, seed and rows, not on how the host ran."""
    prompts, limits = _prompts(9, seed=2), [5, 1, 9, 2, 9, 3, 7, 9, 4]
    params = SamplingParams(temperature=1.0, max_new_tokens=9, seed=5, return_logprobs=True)

    def run(decoder: StaticDecoder) -> list[list[int]]:
        with torch.random.fork_rng(), torch.inference_mode():
            torch.manual_seed(5)
            return _outputs(decoder.decode(prompts, limits, 3, params))

    eager = _decoder(False)
    first = run(eager)
    assert run(eager) == first
    assert run(_decoder(True)) == first
    assert len({tuple(tokens) for tokens in first}) > 1


def test_sampling_in_refilled_rows_follows_the_model(reference: torch.nn.Module) -> None:
    """1200 samples of two tokens through 16 rows (75 rounds of refills): the first token (drawn
    after a refill's prefill) follows the model's softmax, and the second (drawn by a decode
    step of a refilled row) the model's softmax given the first, within 5 standard errors of
    each likely token's probability and of the tail's."""
    prompt = (8, 9, 10)  # its first token's mode has p = 0.58 at T = 0.5: many second tokens
    samples, temperature = 1200, 0.5
    engine = HFRolloutEngine(
        tiny_causal_lm(0), config=HFEngineConfig(device=CPU, decode="static", max_batch_size=16)
    )
    params = SamplingParams(n=samples, temperature=temperature, max_new_tokens=2, seed=0)
    results = engine.generate([GenerationRequest(prompt_token_ids=prompt)], params)
    pairs = [result.output_token_ids for result in results]
    first = Counter(tokens[0] for tokens in pairs)
    common = first.most_common(1)[0][0]
    second = Counter(tokens[1] for tokens in pairs if tokens[0] == common)
    with torch.no_grad():
        logits = reference(torch.tensor([[*prompt, common]])).logits[0]
    for counts, row in ((first, logits[len(prompt) - 1]), (second, logits[len(prompt)])):
        probabilities = (row.double() / temperature).softmax(-1)
        total = sum(counts.values())
        assert total >= 200, f"too few samples ({total}) for a distribution check"
        # the likelier tokens one by one, the long tail of unlikely ones pooled
        likely = [t for t in range(len(probabilities)) if probabilities[t] >= 0.03]
        assert len(likely) >= 2, f"a weak test distribution: {likely}"
        bins = [(float(probabilities[t]), counts[t]) for t in likely]
        bins.append((1 - sum(p for p, _ in bins), total - sum(n for _, n in bins)))
        for p, n in bins:
            bound = 5 * math.sqrt(p * (1 - p) / total)
            assert abs(n / total - p) <= bound, (bins, total)


@pytest.mark.parametrize("decode", ["generate", "static"])
def test_request_caps(reference: torch.nn.Module, decode: str) -> None:
    """``GenerationRequest.max_new_tokens`` caps each request's samples below the call's limit
    (finish reason ``length`` there), a cap above it changes nothing, and ``min_new_tokens``
    applies up to the cap."""
    engine = HFRolloutEngine(
        tiny_causal_lm(0), config=HFEngineConfig(device=CPU, decode=decode, max_batch_size=2)
    )
    prompts = _prompts(4, seed=4)
    caps = [None, 3, 1, 50]
    requests = [
        GenerationRequest(prompt_token_ids=p, max_new_tokens=c)
        for p, c in zip(prompts, caps, strict=True)
    ]
    limits = [6 if c is None else min(c, 6) for c in caps]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6, return_logprobs=True)
    results = engine.generate(requests, greedy)
    for result, prompt, limit in zip(results, prompts, limits, strict=True):
        assert result.output_token_ids == tuple(_greedy(reference, prompt, limit))
        assert result.finish_reason == "length"
    # every first greedy token a stop id, suppressed for 4 tokens: the capped requests end
    # at their caps without one, the others stop at token 5
    stops = tuple({_greedy(reference, p, 1)[0] for p in prompts})
    suppressed = SamplingParams(
        temperature=0.0, max_new_tokens=6, min_new_tokens=4, stop_token_ids=stops
    )
    results = engine.generate(requests, suppressed)
    for result, prompt, limit in zip(results, prompts, limits, strict=True):
        tokens = result.output_token_ids
        assert tokens == tuple(_greedy(reference, prompt, limit, stops, min(4, limit))), result
        assert not set(tokens[: min(4, limit)]) & set(stops), result
    sampled = SamplingParams(n=3, temperature=1.0, max_new_tokens=6, seed=1)
    lengths = [len(r.output_token_ids) for r in engine.generate(requests, sampled)]
    assert lengths == [limit for limit in limits for _ in range(3)]


def test_request_caps_are_checked() -> None:
    with pytest.raises(ValueError, match=r"max_new_tokens must be a positive integer, got 0"):
        GenerationRequest(prompt_token_ids=(1, 2), max_new_tokens=0)
    params = SamplingParams(max_new_tokens=8, min_new_tokens=5)
    capped = GenerationRequest(prompt_token_ids=(1,), max_new_tokens=3).capped(params)
    assert (capped.max_new_tokens, capped.min_new_tokens) == (3, 3)
    assert GenerationRequest(prompt_token_ids=(1,), max_new_tokens=9).capped(params) is params


def test_plan_refills_in_groups_and_compacts() -> None:
    """The host's plan alone: a refill waits for an eighth of the rows (rounded up) unless the
    waiting sequences fit, and compaction moves live rows into the lowest free ones."""
    assert row_buckets(128) == (128, 64, 32, 16, 8, 4)
    assert row_buckets(12) == (12, 8, 4)
    assert row_buckets(3) == (3,)
    plan = RowPlan([(1,)] * 20, [5] * 20, rows=16, check_every=8, checks_stops=False)
    plan.start(plan.take(), width=1)
    assert plan.sequence == list(range(16))
    assert not plan.refill_due()
    plan.end([3])
    assert not plan.refill_due(), "one free row of 16 is under an eighth"
    plan.end([9])
    assert plan.refill_due()
    plan.start(plan.take(), width=1)
    assert (plan.sequence[3], plan.sequence[9]) == (16, 17)
    plan.end([0, 1, 2])  # two sequences wait: three free rows take them
    plan.start(plan.take(), width=1)
    assert plan.sequence[:2] == [18, 19]
    assert not plan.live[2]
    assert not plan.waiting
    plan.end([row for row in plan.live_rows() if row not in (0, 7, 12, 15)])
    move = plan.compaction()
    assert move is not None
    assert (move.sources, move.targets, move.bucket) == ((7, 12, 15), (1, 2, 3), 4)
    assert plan.live_rows() == [0, 1, 2, 3]
    assert plan.sequence[1:4] == [7, 12, 15]
    assert plan.compaction() is None


def test_attended_columns_follow_the_longest_live_row() -> None:
    plan = RowPlan([(1,) * 10, (1,) * 3, (1,)], [50, 50, 50], rows=2, check_every=8,
                   checks_stops=False)  # fmt: skip
    plan.start(plan.take(), width=10)
    assert plan.columns_needed() == 11  # the first step writes column 10 of both rows
    plan.step = 4
    assert plan.columns_needed() == 15
    plan.end([0])
    plan.start(plan.take(), width=1)  # the third sequence, alone: one column of prompt
    assert plan.columns_needed() == 15  # row 1 still writes column 14
    plan.end([1])
    assert plan.columns_needed() == 2


def test_no_row_of_an_attention_mask_is_empty() -> None:
    """A finished row can lie outside the columns a step attends to (its prompt was padded to a
    long one's and the live rows are short); every row of every mask still sees a column (an
    empty row gives NaN in some attention kernels, which would poison the row's cache)."""
    from transformers import AttentionInterface

    from lrft.backends.rollout._hf_attention import GQA_SDPA, gqa_sdpa_attention

    empty_rows = []

    def checked(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        **kwargs: object,
    ) -> tuple[torch.Tensor, None]:
        assert attention_mask is not None
        visible = attention_mask > torch.finfo(attention_mask.dtype).min
        empty_rows.append(int((~visible.any(-1)).sum()))
        return gqa_sdpa_attention(module, query, key, value, attention_mask, **kwargs)  # type: ignore[arg-type]  # forwards transformers' own keyword arguments

    long_prompt = tuple(range(3, 3 + LIVE_BUCKET + 12))
    # Rows 0 and 1 prefilled together (row 1 padded to the long prompt's 140 columns), both
    # done at once; the third sequence refills row 0 alone, so row 1 waits, finished, at
    # column 140 while steps attend to 128 columns.
    prompts = [long_prompt, (7, 8, 9), (10, 11)]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
    decoder = _decoder(False)
    AttentionInterface.register(GQA_SDPA, checked)
    try:
        with torch.inference_mode():
            output = decoder.decode(prompts, [1, 1, 6], 2, greedy)
    finally:
        AttentionInterface.register(GQA_SDPA, gqa_sdpa_attention)
    assert output.steps == 5
    assert output.prefills == 2
    assert empty_rows, "the attention was not called"
    assert not any(empty_rows), f"empty mask rows per layer call: {empty_rows}"


def test_compiled_step_serves_every_width_and_row_bucket_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The step is compiled for dynamic rows and widths on its first call: a later call on the
    same cache that refills rows, attends to another width and compacts to fewer rows compiles
    nothing more (and gives the eager step's tokens)."""
    long_prompt = tuple(range(3, 3 + LIVE_BUCKET + 2))
    prompts = [long_prompt, *_prompts(9, seed=6)]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=20)
    compiled, eager = _decoder(True), _decoder(False)
    shapes: set[tuple[int, int]] = set()
    step = compiled._step

    def recorded(slot: object, mode: object, rows: int, columns: int) -> None:
        shapes.add((rows, columns))
        step(slot, mode, rows, columns)  # type: ignore[arg-type]  # the decoder's own values

    monkeypatch.setattr(compiled, "_step", recorded)
    # the first eight sequences share the long prompt's 130 columns of prefill; the last two,
    # refilled, start from short prompts and outlive them
    limits = [2, 3, 2, 2, 3, 2, 2, 2, 20, 18]
    with torch.inference_mode():
        compiled.decode(prompts[:8], [3] * 8, 8, greedy)
        assert shapes == {(8, 192)}
        with torch._dynamo.config.patch(error_on_recompile=True):
            later = compiled.decode(prompts, limits, 8, greedy)
        want = eager.decode(prompts, limits, 8, greedy)
    assert {(4, 192), (4, 128)} <= shapes, shapes
    assert _outputs(later) == _outputs(want)
