"""The critic of a Qwen2-VL actor: loaded from the VLM's folder (backbone weights as saved, a new
value head), its values over rows with 0, 1 and 2 images equal an independent reference (the
plain transformers ``Qwen2VLModel`` on each unpadded sequence with its media, transformers
placing the tokens itself, then the head's weights), and gradients reach the vision tower."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import Qwen2VLModel

from lrft.api import GenerationResult
from lrft.models.critic import VALUE_HEAD, load_critic
from lrft.models.vision_critic import Qwen2VLForValues
from lrft.testing.conformance._rollout_media_checks import media_prompts
from lrft.testing.reference import load_reference_vlm
from lrft.testing.vision_models import save_tiny_vlm
from lrft.trainer.critic import response_values
from lrft.trainer.sequences import pack

CPU = torch.device("cpu")
_RESPONSES = ((65, 66, 67), (70,), (48, 49, 50, 51), (120, 121))


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_vlm(tmp_path_factory.mktemp("vlm") / "model")


def test_values_of_image_rows_equal_a_plain_backbone_forward(vlm_dir: Path) -> None:
    critic = load_critic(vlm_dir, seed=3)
    assert isinstance(critic, Qwen2VLForValues)
    torch.nn.Module.eval(critic)
    vlm = load_reference_vlm(vlm_dir)
    saved = dict(vlm.named_parameters())
    for name, parameter in critic.model.named_parameters():
        assert torch.equal(parameter, saved[f"model.{name}"]), name
    prompts = media_prompts(vlm_dir, rank=0)  # 1, 0, 2 and 1 images
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
    sequences = pack(results, media=[p.processed for p in prompts])
    with torch.no_grad():
        values = response_values(critic, sequences, device=CPU)
    backbone = Qwen2VLModel.from_pretrained(vlm_dir, dtype=torch.float32)
    torch.nn.Module.eval(backbone)
    head = getattr(critic, VALUE_HEAD)
    for row, (prompt, tokens) in enumerate(zip(prompts, _RESPONSES, strict=True)):
        ids = [*prompt.request.prompt_token_ids, *tokens]
        kwargs: dict[str, torch.Tensor] = {}
        if prompt.processed is not None:
            kwargs = dict(prompt.processed.tensors)
            extra = len(tokens)
            for name, per_token in prompt.processed.token_tensors.items():
                kwargs[name] = torch.cat([per_token, per_token.new_zeros(extra)])[None]
        with torch.no_grad():
            hidden = backbone(input_ids=torch.tensor([ids]), **kwargs).last_hidden_state[0]
        scores = hidden @ head.weight[0] + head.bias[0]
        start = len(prompt.request.prompt_token_ids) - 1
        want = scores[start : start + len(tokens)]
        torch.testing.assert_close(values[row, : len(tokens)], want, atol=2e-6, rtol=0)
        assert not values[row, len(tokens) :].any()


def test_the_value_loss_reaches_the_vision_tower(vlm_dir: Path) -> None:
    critic = load_critic(vlm_dir, seed=3)
    prompts = media_prompts(vlm_dir, rank=1)
    results = [
        GenerationResult(
            request_id=p.request.request_id,
            sample_index=0,
            prompt_token_ids=p.request.prompt_token_ids,
            output_token_ids=(65, 66),
            finish_reason="length",
        )
        for p in prompts
    ]
    sequences = pack(results, media=[p.processed for p in prompts])
    torch.autograd.backward(response_values(critic, sequences, device=CPU).square().sum())
    tower = critic.model.visual
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in tower.parameters())
