"""Training on prompts with audio, in one process: gradients through the audio encoder with
gradient checkpointing equal those without, the idle clip of a micro-batch without audio leaves
the logits and gradients of the text model exactly as they are, and the token budget counts each
clip's mel frames."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch

from lrft.api import GenerationResult
from lrft.testing.audio_models import FRAMES, save_tiny_audio_lm
from lrft.testing.conformance._rollout_media_checks import AUDIO, MediaPrompt, media_prompts
from lrft.testing.reference import load_reference_vlm
from lrft.trainer.experience import ExperienceBatch
from lrft.trainer.logprobs import response_logprobs
from lrft.trainer.replay import ReplayBuffer
from lrft.trainer.sequences import Sequences, forward_inputs, pack

CPU = torch.device("cpu")
_RESPONSES = ((65, 66, 67), (70,), (48, 49, 50, 51), (120, 121))


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def audio_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_audio_lm(tmp_path_factory.mktemp("audio-training") / "model")


def _sequences(prompts: Sequence[MediaPrompt]) -> Sequences:
    results = [
        GenerationResult(
            request_id=p.request.request_id,
            sample_index=0,
            prompt_token_ids=p.request.prompt_token_ids,
            output_token_ids=tokens,
            finish_reason="length",
        )
        for p, tokens in zip(prompts, _RESPONSES, strict=True)
    ]
    return pack(results, media=[p.processed for p in prompts])


def test_gradient_checkpointing_through_the_audio_encoder(audio_lm: Path) -> None:
    sequences = _sequences(media_prompts(audio_lm, rank=0, kind=AUDIO))

    def gradients(checkpointing: bool) -> dict[str, torch.Tensor]:
        model = load_reference_vlm(audio_lm)
        model.train()
        if checkpointing:
            # transformers 5.24 renamed it; the old name still works, with a warning
            enable = getattr(model, "activation_checkpointing_enable", None)
            (enable or model.gradient_checkpointing_enable)()
        torch.autograd.backward(
            response_logprobs(model, sequences, temperature=1.0, device=CPU).sum()
        )
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    plain, checkpointed = gradients(False), gradients(True)
    assert set(plain) == set(checkpointed)
    assert any(name.startswith("model.audio_tower.layers.") for name in plain)
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, atol=1e-6, rtol=1e-5, msg=name)


def test_the_idle_clip_changes_nothing_of_a_text_batch(audio_lm: Path) -> None:
    """A micro-batch of text rows gets an idle clip (so that sharded ranks all run the encoder):
    its logits equal the text model's without it exactly, the text weights' gradients too, and
    the encoder's gradients exist and are zero."""
    prompts = media_prompts(audio_lm, rank=0, kind=AUDIO)
    text_row = torch.tensor([1])  # the prompt without clips
    sequences = _sequences(prompts).select(text_row)
    model = load_reference_vlm(audio_lm)
    inputs = forward_inputs(model, sequences, CPU)
    assert tuple(inputs["input_features"].shape) == (1, 16, FRAMES)
    assert inputs["feature_attention_mask"].sum().item() == 1
    with_idle = model(**inputs).logits
    torch.autograd.backward(with_idle.sum())
    idle_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    text_only = model(
        input_ids=sequences.input_ids, attention_mask=sequences.attention_mask, use_cache=False
    ).logits
    assert torch.equal(with_idle, text_only)
    torch.autograd.backward(text_only.sum())
    text_grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    for name, grad in text_grads.items():
        torch.testing.assert_close(idle_grads[name], grad, atol=0, rtol=0, msg=name)
    encoder = [n for n in idle_grads if n.startswith("model.audio_tower.")]
    assert encoder
    assert all(not idle_grads[n].any() for n in encoder)


def test_the_token_budget_counts_each_clips_frames(audio_lm: Path) -> None:
    prompts = media_prompts(audio_lm, rank=0, kind=AUDIO)  # 1, 0, 2 and 1 clips
    sequences = _sequences(prompts)
    zeros = torch.zeros(len(prompts), sequences.action_mask.shape[1])
    buffer = ReplayBuffer(seed=0)
    buffer.append(
        ExperienceBatch(
            sequences=sequences,
            old_logprobs=None,
            ref_logprobs=None,
            scores=torch.zeros(len(prompts)),
            advantages=zeros,
        )
    )
    tokens = [
        len(p.request.prompt_token_ids) + len(r) for p, r in zip(prompts, _RESPONSES, strict=True)
    ]
    # every clip is padded to the feature extractor's window, which the encoder reads whole
    assert buffer.row_lengths().tolist() == [
        tokens[0] + FRAMES,
        tokens[1],
        tokens[2] + 2 * FRAMES,
        tokens[3] + FRAMES,
    ]
