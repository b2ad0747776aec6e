"""The trainer's packed paths take the steps its padded paths take: the policy and critic updates
(each optimizer step's gradients, with and without a token budget), the gradient-free logprob
and value passes, and a reward model's scores."""

from __future__ import annotations

import copy
from collections.abc import Callable

import attrs
import pytest
import torch
from torch import Tensor
from transformers import Qwen2ForSequenceClassification, Qwen2ForTokenClassification

from lrft.algo import PolicyLossConfig
from lrft.models.packed_attention import use_packed_attention
from lrft.rewards import RewardSample, SequenceClassifierReward
from lrft.testing.models import tiny_causal_lm, tiny_qwen2_config
from lrft.trainer.critic import CriticUpdate, critic_values
from lrft.trainer.experience import ExperienceBatch
from lrft.trainer.logprobs import plain_response_logprobs
from lrft.trainer.micro_batches import pack_by_tokens
from lrft.trainer.packing import PADDED, TokenLayout
from lrft.trainer.passes import gradient_free, pass_rows
from lrft.trainer.policy import PolicyUpdate
from lrft.trainer.replay import ReplayBuffer
from tests.unit.trainer.recorders import GradientRecorder
from tests.unit.trainer.samples import random_responses
from tests.unit.trainer.test_policy_speed import TEMPERATURE
from tests.unit.trainer.test_policy_speed import _experience as policy_experience

CPU = torch.device("cpu")
PACKED = TokenLayout(packed=True)


def _packed(model: torch.nn.Module) -> torch.nn.Module:
    twin = copy.deepcopy(model)
    use_packed_attention(twin)
    return twin


def _experience(rows: int, seed: int) -> ExperienceBatch:
    """The policy tests' experience, with critic values and returns as well."""
    batch = policy_experience(rows, seed)
    mask = batch.sequences.action_mask
    generator = torch.Generator().manual_seed(seed + 100)
    return attrs.evolve(
        batch,
        values=torch.where(mask, torch.randn(mask.shape, generator=generator) * 0.1, 0.0),
        returns=torch.where(mask, torch.randn(mask.shape, generator=generator), 0.0),
    )


def _steps(
    module: torch.nn.Module,
    run: Callable[[GradientRecorder, ReplayBuffer], object],
    batch: ExperienceBatch,
) -> list[list[Tensor]]:
    recorder = GradientRecorder(module)
    buffer = ReplayBuffer(seed=5)
    buffer.append(batch)
    run(recorder, buffer)
    recorder.check_only_last_backward_syncs()
    return recorder.steps


def _assert_same_steps(got: list[list[Tensor]], expected: list[list[Tensor]]) -> None:
    assert len(got) == len(expected) == 2
    for got_step, expected_step in zip(got, expected, strict=True):
        assert any(g.abs().sum() > 0 for g in expected_step)
        for a, b in zip(got_step, expected_step, strict=True):
            assert float((a - b).abs().max()) <= 1e-4
            scale = b.double().norm().clamp(min=1e-30)
            assert float((a.double() - b.double()).norm() / scale) < 1e-5


@pytest.mark.parametrize(
    ("budget", "extra"),
    [(None, {}), (24, {"entropy_coef": 0.01}), (24, {"use_kl_loss": True, "kl_coef": 0.3})],
    ids=["ppo-one-row-per-micro-batch", "entropy-token-budget", "kl-loss-token-budget"],
)
def test_packed_policy_steps_equal_the_padded_ones(
    budget: int | None, extra: dict[str, object]
) -> None:
    batch = _experience(12, seed=1)
    settings: dict[str, object] = {
        "micro_batch_size": 3,
        "accumulation": 2,
        "epochs": 1,
        "temperature": TEMPERATURE,
        "loss": PolicyLossConfig(),
        **extra,
    }
    padded = _steps(
        tiny_causal_lm(0),
        lambda model, buffer: PolicyUpdate(**settings).run(model, buffer, step=0, device=CPU),  # type: ignore[arg-type]  # mixed settings and a test double of the model handle
        batch,
    )
    packed_update = PolicyUpdate(**settings, layout=PACKED, max_tokens_per_micro_batch=budget)  # type: ignore[arg-type]  # mixed settings and a test double of the model handle
    packed = _steps(
        _packed(tiny_causal_lm(0)),
        lambda model, buffer: packed_update.run(model, buffer, step=0, device=CPU),  # type: ignore[arg-type]  # mixed settings and a test double of the model handle
        batch,
    )
    _assert_same_steps(packed, padded)


def _critic() -> torch.nn.Module:
    config = tiny_qwen2_config()
    config.num_labels = 1
    config.classifier_dropout = 0.0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Qwen2ForTokenClassification(config)  # type: ignore[no-untyped-call]  # unannotated in transformers


@pytest.mark.parametrize("budget", [None, 24], ids=["one-row-per-micro-batch", "token-budget"])
def test_packed_critic_steps_and_values_equal_the_padded_ones(budget: int | None) -> None:
    batch = _experience(12, seed=2)
    settings = {"micro_batch_size": 3, "accumulation": 2, "epochs": 1, "value_clip": 0.05}
    padded = _steps(
        _critic(),
        lambda model, buffer: CriticUpdate(**settings).run(model, buffer, step=0, device=CPU),  # type: ignore[arg-type]  # mixed settings and a test double of the model handle
        batch,
    )
    update = CriticUpdate(**settings, layout=PACKED, max_tokens_per_micro_batch=budget)  # type: ignore[arg-type]  # mixed settings and a test double of the model handle
    packed = _steps(
        _packed(_critic()),
        lambda model, buffer: update.run(model, buffer, step=0, device=CPU),  # type: ignore[arg-type]  # mixed settings and a test double of the model handle
        batch,
    )
    _assert_same_steps(packed, padded)

    class Handle:
        def __init__(self, module: torch.nn.Module) -> None:
            self.module = module

    sequences = batch.sequences
    expected = critic_values(Handle(_critic()), sequences, micro_batch_size=4, device=CPU)  # type: ignore[arg-type]  # mixed settings and a test double of the model handle
    got = critic_values(
        Handle(_packed(_critic())),  # type: ignore[arg-type]  # mixed settings and a test double of the model handle
        sequences,
        micro_batch_size=4,
        device=CPU,
        layout=PACKED,
        max_tokens=budget,
    )
    assert float((got - expected).abs().max()) <= 1e-5
    assert bool((got[~sequences.action_mask] == 0).all())


def test_packed_passes_fill_the_budget_and_cover_every_row_once() -> None:
    sequences = random_responses(10, torch.Generator().manual_seed(3))
    lengths = sequences.attention_mask.sum(-1)
    plan = pass_rows(sequences, micro_batch_size=4, layout=PACKED, max_tokens=20, device=CPU)
    rows = [int(r) for part in plan if part is not None for r in part]
    assert sorted(rows) == list(range(10))
    for part in plan:
        assert part is not None
        assert len(part) == 1 or int(lengths[part].sum()) <= 20
    padded = pass_rows(sequences, micro_batch_size=4, layout=PADDED, max_tokens=20, device=CPU)
    assert [len(part) for part in padded if part is not None] == [4, 4, 2]  # by rows, unpacked


@pytest.mark.parametrize(
    ("lengths", "budget", "expected"),
    [
        ([5, 3, 8, 2], 10, [[2, 3], [0, 1]]),  # padded: [[2], [0, 1], [3]]
        ([4, 4, 4, 4], 8, [[0, 1], [2, 3]]),
        ([12, 1], 10, [[0], [1]]),
    ],
)
def test_packed_budget_counts_real_tokens(
    lengths: list[int], budget: int, expected: list[list[int]]
) -> None:
    assert pack_by_tokens(lengths, budget, packed=True) == expected


def test_gradient_free_packed_logprobs_equal_the_padded_ones() -> None:
    sequences = random_responses(9, torch.Generator().manual_seed(4))
    padded_model, packed_model = tiny_causal_lm(1), _packed(tiny_causal_lm(1))

    def forward(model: torch.nn.Module, layout: TokenLayout) -> Callable[..., Tensor]:
        return lambda chunk: plain_response_logprobs(
            model, chunk, temperature=1.0, device=CPU, layout=layout
        )

    expected = gradient_free(
        sequences, forward(padded_model, PADDED), micro_batch_size=2, layout=PADDED, device=CPU
    )
    for budget in (None, 16):
        got = gradient_free(
            sequences,
            forward(packed_model, PACKED),
            micro_batch_size=2,
            layout=PACKED,
            max_tokens=budget,
            device=CPU,
        )
        assert float((got - expected).abs().max()) <= 1e-5


def test_a_packed_reward_model_scores_as_the_padded_one() -> None:
    config = tiny_qwen2_config()
    config.num_labels = 2
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        model = Qwen2ForSequenceClassification(config).eval()  # type: ignore[no-untyped-call]  # unannotated in transformers

    class Bytes:
        def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
            return [3 + b % 250 for b in text.encode()]

    samples = [
        RewardSample(prompt=p, response=r, label="", reference=None, metadata={})
        for p, r in [("2+2=", "4"), ("a longer prompt here ", "and its answer"), ("x", "yz")]
    ]
    reward = SequenceClassifierReward(model=model, tokenizer=Bytes(), label_index=1)
    packed_reward = SequenceClassifierReward(
        model=_packed(model), tokenizer=Bytes(), label_index=1, packed=True
    )
    expected, got = reward(samples).scores_tensor(), packed_reward(samples).scores_tensor()
    assert float((got - expected).abs().max()) <= 1e-5
    assert len(set(expected.tolist())) == 3  # the samples score differently
