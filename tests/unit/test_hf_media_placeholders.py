"""The hf engine never samples a media placeholder id (Qwen2-Audio's ``<|AUDIO|>``), on the
``generate`` path and the static loop, greedy and sampled, even where the model's own argmax
is that id; the logprobs stay those of the unmasked distribution (``RolloutEngine.generate``).

The model is the tiny Qwen2-Audio with its output row for ``<|AUDIO|>`` pointed along the mean
final hidden state, so that the placeholder is the unmasked argmax after every prompt (checked
against the plain forward, so the test cannot pass vacuously)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lrft.api import SamplingParams
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.testing.audio_models import AUDIO_TOKEN_ID, save_tiny_audio_lm
from lrft.testing.conformance._rollout_media_checks import AUDIO, MediaPrompt, media_prompts
from lrft.testing.reference import load_reference_vlm, media_greedy_continuation

STEPS = 6


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = save_tiny_audio_lm(tmp_path_factory.mktemp("placeholder") / "model")
    model = load_reference_vlm(folder)
    prompts = media_prompts(folder, rank=0, kind=AUDIO)
    hidden = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt.request.prompt_token_ids])
            extra = {} if prompt.processed is None else dict(prompt.processed.tensors)
            states = model(input_ids=ids, output_hidden_states=True, **extra).hidden_states[-1]
            hidden.append(states[0])
        direction = torch.cat(hidden).mean(0)
        head = model.lm_head.weight
        head[AUDIO_TOKEN_ID] = 40 * direction / direction.norm() ** 2
    model.save_pretrained(folder)
    return folder


def _unmasked_first_tokens(model_dir: Path, prompts: list[MediaPrompt]) -> list[int]:
    model = load_reference_vlm(model_dir)
    firsts = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt.request.prompt_token_ids])
            extra = {} if prompt.processed is None else dict(prompt.processed.tensors)
            firsts.append(int(model(input_ids=ids, **extra).logits[0, -1].argmax()))
    return firsts


@pytest.mark.parametrize("decode", ["generate", "static"])
def test_the_audio_placeholder_is_never_sampled(model_dir: Path, decode: str) -> None:
    prompts = media_prompts(model_dir, rank=0, kind=AUDIO)
    assert _unmasked_first_tokens(model_dir, prompts) == [AUDIO_TOKEN_ID] * len(prompts)
    engine = HFRolloutEngine.from_pretrained(model_dir, config=HFEngineConfig(decode=decode))
    requests = [p.request for p in prompts]
    greedy = engine.generate(
        requests, SamplingParams(temperature=0.0, max_new_tokens=STEPS, return_logprobs=True)
    )
    reference = load_reference_vlm(model_dir)
    for prompt, result in zip(prompts, greedy, strict=True):
        want = media_greedy_continuation(
            reference, prompt.processed, prompt.request.prompt_token_ids, STEPS
        )
        assert list(result.output_token_ids) == want
        assert AUDIO_TOKEN_ID not in result.output_token_ids
        # the first token's logprob is of the unmasked distribution, where the placeholder
        # holds most of the mass: well below what the masked distribution would give
        assert result.logprobs is not None
        ids = torch.tensor([prompt.request.prompt_token_ids])
        extra = {} if prompt.processed is None else dict(prompt.processed.tensors)
        with torch.no_grad():
            logits = reference(input_ids=ids, **extra).logits[0, -1].double()
        unmasked = torch.log_softmax(logits, -1)[want[0]]
        assert result.logprobs[0] == pytest.approx(float(unmasked), abs=1e-5)
    sampled = engine.generate(
        requests, SamplingParams(n=8, temperature=1.0, max_new_tokens=STEPS, seed=5)
    )
    assert all(AUDIO_TOKEN_ID not in result.output_token_ids for result in sampled)
