"""The critic: built from a causal LM, its values against a plain per-row forward, and the
experience pass's values, GAE advantages and returns against a direct-sum reference."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, PreTrainedModel

from lrft.algo import AdvantageParams
from lrft.api.errors import ConfigError
from lrft.api.protocols import FrozenModel
from lrft.api.types import GenerationResult, SamplingParams
from lrft.models.critic import load_critic
from lrft.rewards import PerSampleReward
from lrft.testing.models import save_tiny_causal_lm
from lrft.trainer.critic import critic_values, response_values
from lrft.trainer.experience import ExperienceMaker
from lrft.trainer.sequences import pack


def _result(prompt: list[int], output: list[int]) -> GenerationResult:
    return GenerationResult(
        request_id="r",
        sample_index=0,
        prompt_token_ids=prompt,
        output_token_ids=output,
        finish_reason="stop",
    )


RESULTS = [
    _result([5, 6, 7], [8, 9]),
    _result([10], [11, 12, 13, 14]),
    _result([3, 4], [5]),
    _result([20, 21, 22, 23], [24, 25, 26]),
]


@pytest.fixture(scope="module")
def lm_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_causal_lm(tmp_path_factory.mktemp("critic") / "lm", seed=3)


def _plain_values(critic: PreTrainedModel, result: GenerationResult) -> list[float]:
    """The head's output at each state before a response token, from an unpadded forward."""
    ids = torch.tensor([list(result.prompt_token_ids) + list(result.output_token_ids)])
    with torch.no_grad():
        head = critic(input_ids=ids).logits[0, :, 0].double()
    p = len(result.prompt_token_ids)
    return [float(head[p + t - 1]) for t in range(len(result.output_token_ids))]


def test_backbone_comes_from_the_causal_lm_and_the_head_is_seeded(
    lm_folder: Path, tmp_path: Path
) -> None:
    lm = AutoModelForCausalLM.from_pretrained(lm_folder)
    torch.manual_seed(0)
    critic = load_critic(lm_folder, seed=5)
    torch.manual_seed(1)  # the global RNG does not decide the head: every rank builds the same
    again = load_critic(lm_folder, seed=5)
    other = load_critic(lm_folder, seed=6)
    for name, parameter in lm.model.named_parameters():
        assert torch.equal(critic.get_parameter(f"model.{name}"), parameter), name
    head = critic.get_submodule("score")
    assert isinstance(head, torch.nn.Linear)
    assert head.out_features == 1
    assert torch.equal(head.weight, again.get_parameter("score.weight"))
    assert not torch.equal(head.weight, other.get_parameter("score.weight"))
    assert head.bias is not None
    assert head.bias.abs().sum() == 0
    # a saved critic brings its own head back instead of a fresh one
    critic.save_pretrained(tmp_path / "saved")
    restored = load_critic(tmp_path / "saved", seed=99)
    for name, parameter in critic.named_parameters():
        assert torch.equal(restored.get_parameter(name), parameter), name


def test_a_folder_missing_backbone_weights_is_refused(lm_folder: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    AutoModelForCausalLM.from_pretrained(lm_folder).save_pretrained(broken)
    weights = load_file(broken / "model.safetensors")
    del weights["model.norm.weight"]
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConfigError, match=r"lacks backbone weights \['model.norm.weight'\]"):
        load_critic(broken, seed=0)


def test_response_values_equal_an_unpadded_forward_per_row(lm_folder: Path) -> None:
    critic = load_critic(lm_folder, seed=5)
    torch.nn.Module.eval(critic)  # PreTrainedModel re-declares eval without annotations
    got = response_values(critic, pack(RESULTS), device=torch.device("cpu"))
    for row, result in enumerate(RESULTS):
        expected = _plain_values(critic, result)
        n = len(expected)
        assert got[row, :n].tolist() == pytest.approx(expected, abs=1e-5)
        assert got[row, n:].abs().sum() == 0


def _direct_sum_gae(
    rewards: list[float], values: list[float], gamma: float, lambd: float
) -> tuple[list[float], list[float]]:
    """A_t = sum_{j >= t} (gamma lambda)^(j - t) delta_j, delta_j = r_j + gamma V_{j+1} - V_j,
    V after the last token 0; returns R_t = A_t + V_t."""
    n = len(rewards)
    deltas = [
        rewards[j] + gamma * (values[j + 1] if j + 1 < n else 0.0) - values[j] for j in range(n)
    ]
    advantages = [
        sum((gamma * lambd) ** (j - t) * deltas[j] for j in range(t, n)) for t in range(n)
    ]
    return advantages, [a + v for a, v in zip(advantages, values, strict=True)]


def test_experience_values_advantages_and_returns_equal_a_direct_sum_reference(
    lm_folder: Path,
) -> None:
    critic = load_critic(lm_folder, seed=5)
    torch.nn.Module.eval(critic)
    sequences = pack(RESULTS)
    handle = cast(FrozenModel, SimpleNamespace(module=critic))
    values = critic_values(handle, sequences, micro_batch_size=3, device=torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    mask = sequences.action_mask
    old = torch.where(mask, -torch.rand(mask.shape, generator=generator), 0.0)
    ref = torch.where(mask, -torch.rand(mask.shape, generator=generator), 0.0)
    scores = torch.tensor([1.0, 0.0, 0.5, 1.0])
    gamma, lambd, kl_coef = 0.9, 0.8, 0.1
    maker = ExperienceMaker(
        engine=None,  # make never touches the engine
        decode=lambda ids: "",
        reward=PerSampleReward(name="unused", score=lambda sample: 0.0),
        sampling=SamplingParams(n=1),
        estimator="gae",
        micro_batch_size=2,
        device=torch.device("cpu"),
        kl_coef=kl_coef,
        kl_estimator="k1",
        advantage_params=AdvantageParams(gamma=gamma, lambd=lambd),
    )
    experience = maker.make(sequences, scores, old, ref, values=values)
    assert experience.values is not None
    assert experience.returns is not None

    raw: list[list[float]] = []
    for row, result in enumerate(RESULTS):
        n = len(result.output_token_ids)
        plain = _plain_values(critic, result)
        # KL in the reward on every token (k1 = old - ref), the score on the last one
        rewards = [-kl_coef * float(old[row, t] - ref[row, t]) for t in range(n)]
        rewards[-1] += float(scores[row])
        advantages, returns = _direct_sum_gae(rewards, plain, gamma, lambd)
        assert experience.values[row, :n].tolist() == pytest.approx(plain, abs=1e-5)
        assert experience.returns[row, :n].tolist() == pytest.approx(returns, abs=1e-5)
        for tensor in (experience.values, experience.returns, experience.advantages):
            assert tensor[row, n:].abs().sum() == 0
        raw.append(advantages)
    flat = torch.tensor([a for row in raw for a in row], dtype=torch.float64)
    mean, std = flat.mean(), flat.std(unbiased=True)  # one whitening over the batch's tokens
    for row, advantages in enumerate(raw):
        whitened = [(a - float(mean)) / (float(std) + 1e-8) for a in advantages]
        got = experience.advantages[row, : len(advantages)].tolist()
        assert got == pytest.approx(whitened, abs=1e-4)
