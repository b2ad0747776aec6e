"""The hf engine's static-cache loop on CPU: truncation against transformers' own logits warpers,
the sampled distribution against the model's softmax, stopping early, and its settings' errors.

Generation parity with the reference decode is the conformance suite's job
(``tests/conformance/test_hf_engine.py`` runs it on the static loop too).
"""

from __future__ import annotations

import math
from collections import Counter

import attrs
import pytest
import torch
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from lrft.api import ConfigError, GenerationRequest, SamplingParams
from lrft.backends.rollout._hf_decode import StaticDecoder, static_decode_unsupported
from lrft.backends.rollout._hf_sampling import top_k_top_p
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.testing.models import tiny_causal_lm, tiny_qwen2_config

PROMPT = (5, 17, 42, 9)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)  # tiny models: one thread is fastest on shared cores


@pytest.mark.parametrize(("top_k", "top_p"), [(1, 1.0), (3, 1.0), (0, 0.3), (0, 1e-6), (7, 0.9)])
def test_truncation_matches_transformers_warpers(top_k: int, top_p: float) -> None:
    generator = torch.Generator().manual_seed(top_k * 100 + int(top_p * 10))
    scores = torch.randn((4, 50), generator=generator) * 3
    want = scores.clone()
    input_ids = torch.zeros((4, 1), dtype=torch.long)
    if top_k > 0:
        want = TopKLogitsWarper(top_k)(input_ids, want)
    if top_p < 1.0:
        want = TopPLogitsWarper(top_p)(input_ids, want)
    vocab = scores.shape[1]
    index = torch.full((4, 1), vocab - top_k if top_k > 0 else 0)
    got = top_k_top_p(scores, index, torch.tensor(top_p))
    assert torch.equal(torch.isinf(got), torch.isinf(want)), (top_k, top_p)
    assert torch.equal(got[~torch.isinf(got)], want[~torch.isinf(want)])


def _first_token_distribution(temperature: float, top_k: int, top_p: float) -> dict[int, float]:
    """The model's distribution of the first generated token, truncated by hand."""
    model = tiny_causal_lm(0)
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT])).logits[0, -1].double() / temperature
    probabilities = logits.softmax(-1)
    order = probabilities.argsort(descending=True).tolist()
    kept = order[:top_k] if top_k > 0 else order
    if top_p < 1.0:
        mass, nucleus = 0.0, []
        for token in kept:
            nucleus.append(token)
            mass += float(probabilities[token])
            if mass >= top_p:
                break
        kept = nucleus
    total = sum(float(probabilities[t]) for t in kept)
    return {t: float(probabilities[t]) / total for t in kept}


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(0.8, 4, 1.0), (0.5, 0, 0.5)])
def test_sampling_follows_the_model_distribution(
    temperature: float, top_k: int, top_p: float
) -> None:
    samples = 3000
    engine = HFRolloutEngine(
        tiny_causal_lm(0),
        config=HFEngineConfig(device="cpu", decode="static", max_batch_size=samples),
    )
    params = SamplingParams(
        n=samples, temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=1, seed=0
    )
    results = engine.generate([GenerationRequest(prompt_token_ids=PROMPT)], params)
    counts = Counter(r.output_token_ids[0] for r in results)
    want = _first_token_distribution(temperature, top_k, top_p)
    assert 2 <= len(want) <= 12, f"a weak test distribution: {want}"
    assert set(counts) <= set(want), f"sampled tokens outside the kept set: {counts} vs {want}"
    for token, probability in want.items():
        frequency = counts[token] / samples
        bound = 5 * math.sqrt(probability * (1 - probability) / samples)
        assert abs(frequency - probability) <= bound, (token, frequency, probability, bound)


def test_stops_early_once_every_row_stopped() -> None:
    model = tiny_causal_lm(0)
    decoder = StaticDecoder(model, torch.device("cpu"), cuda_graphs=False, check_every=4)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=40)
    prompts = [PROMPT, PROMPT]
    with torch.inference_mode():
        full = decoder.decode(prompts, [40, 40], 2, greedy)
        assert full.lengths.tolist() == [40, 40]
        assert full.steps == 39
        stop = int(full.tokens[0, 0])  # the first token: both rows stop at step 0
        stopped = decoder.decode(prompts, [40, 40], 2, attrs.evolve(greedy, stop_token_ids=(stop,)))
    # The host reads the stop flags every 4 steps: 4 steps ran rather than 39.
    assert stopped.steps == 4, stopped.steps
    assert stopped.lengths.tolist() == [1, 1]
    assert stopped.tokens[:, 0].tolist() == [stop, stop]


def test_decode_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"decode must be one of .*'cuda_graph'.*got 'fast'"):
        HFEngineConfig(decode="fast")
    with pytest.raises(ConfigError, match=r"decode='cuda_graph' needs a CUDA device, got cpu"):
        HFRolloutEngine(tiny_causal_lm(0), config=HFEngineConfig(device="cpu", decode="cuda_graph"))


def test_models_the_static_loop_cannot_mask_are_refused() -> None:
    config = tiny_qwen2_config()
    config.layer_types = ["sliding_attention", "full_attention"]
    from transformers import Qwen2ForCausalLM

    sliding = Qwen2ForCausalLM(config)
    assert "sliding_attention" in (static_decode_unsupported(sliding) or "")
    with pytest.raises(ConfigError, match=r"decode='static' needs a static KV cache, but"):
        HFRolloutEngine(sliding, config=HFEngineConfig(device="cpu", decode="static"))
    assert static_decode_unsupported(tiny_causal_lm(0)) is None


def test_compiled_step_needs_no_recompile_after_release() -> None:
    """The step compiled once (dynamo's ``eager`` backend: the guards are the same as inductor's,
    without its compile time) serves a new static cache of the same shape, unchanged."""
    greedy = SamplingParams(temperature=0.0, max_new_tokens=10)
    reference = StaticDecoder(tiny_causal_lm(0), torch.device("cpu"), cuda_graphs=False)
    compiled = StaticDecoder(
        tiny_causal_lm(0), torch.device("cpu"), cuda_graphs=False, compile_backend="eager"
    )
    prompts = [PROMPT, (100, 3, 77)]
    with torch.inference_mode():
        want = reference.decode(prompts, [10, 10], 2, greedy).tokens
        assert torch.equal(compiled.decode(prompts, [10, 10], 2, greedy).tokens, want)
        compiled.release()
        with torch._dynamo.config.patch(error_on_recompile=True):
            assert torch.equal(compiled.decode(prompts, [10, 10], 2, greedy).tokens, want)


def test_compiled_step_needs_no_recompile_after_sleep_and_wake() -> None:
    """Sleeping and waking move the weights (new tensors, new addresses); a step compiled on the
    old ones must neither recompile nor read them (on CPU level 2 really frees them)."""
    other = tiny_causal_lm(1)
    engine = HFRolloutEngine(tiny_causal_lm(0), config=HFEngineConfig(device="cpu"))
    ids = torch.tensor([PROMPT])

    @torch.compile(backend="eager")
    def logits(model: torch.nn.Module) -> torch.Tensor:
        output: torch.Tensor = model(ids).logits
        return output

    with torch.no_grad():
        logits(engine.model)
        engine.sleep(2)
        engine.wake()
        engine.load_weights(list(other.state_dict().items()), version=2)
        with torch._dynamo.config.patch(error_on_recompile=True):
            assert torch.equal(logits(engine.model), other(ids).logits)


def test_gqa_attention_equals_transformers_sdpa() -> None:
    """lrft's attention (grouped heads in place, masks narrower than the cache) computes what
    transformers' ``sdpa`` does, with and without a padding mask."""
    from lrft.backends.rollout._hf_attention import GQA_SDPA, use_gqa_sdpa

    reference, model = tiny_causal_lm(0), tiny_causal_lm(0)
    use_gqa_sdpa(model)
    assert model.config._attn_implementation == GQA_SDPA
    ids = torch.tensor([[0, 0, 5, 17, 42, 9], [100, 3, 77, 8, 1, 2]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        for kwargs in ({}, {"attention_mask": mask}):
            want = reference(input_ids=ids, **kwargs).logits
            got = model(input_ids=ids, **kwargs).logits
            keep = mask.bool() if kwargs else torch.ones_like(mask, dtype=torch.bool)
            worst = (got - want)[keep].abs().max().item()
            assert worst < 1e-5, f"logits differ by {worst} with {sorted(kwargs)}"


def test_decoding_across_attended_widths_matches_the_reference() -> None:
    """Rows of very different prompt lengths decoded past several attended widths (each step
    reads only the cache columns up to the next ``LIVE_BUCKET`` multiple): every logprob equals
    a plain full forward's ``log_softmax`` of the same tokens."""
    from lrft.backends.rollout._hf_decode import LIVE_BUCKET
    from lrft.testing.reference import token_logprobs

    long_prompt = tuple((7 * i + 3) % 250 + 1 for i in range(LIVE_BUCKET + 20))
    prompts = [PROMPT, long_prompt]
    params = SamplingParams(temperature=1.0, max_new_tokens=150, seed=1, return_logprobs=True)
    decoder = StaticDecoder(tiny_causal_lm(0), torch.device("cpu"), cuda_graphs=False)
    with torch.inference_mode():
        output = decoder.decode(prompts, [150, 150], 2, params)
    assert output.logprobs is not None
    assert len(long_prompt) + 150 > 2 * LIVE_BUCKET, "the decode must cross several widths"
    reference = tiny_causal_lm(0)
    for row, prompt in enumerate(prompts):
        tokens = output.tokens[row].tolist()
        want = torch.tensor(token_logprobs(reference, prompt, tokens))
        worst = (output.logprobs[row] - want).abs().max().item()
        assert worst < 1e-4, f"row {row} (prompt of {len(prompt)}): logprobs differ by {worst}"
