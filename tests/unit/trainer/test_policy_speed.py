"""The policy update's speed paths change no gradient: token-budget micro-batches against the
fixed micro-batches, and on-policy old logprobs against a separate old-logprob pass."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from lrft.algo import PolicyLossConfig, aggregate_loss, aggregation_divisor
from lrft.algo.types import AggregationMode
from lrft.api.errors import ConfigError
from lrft.config import TrainConfig
from lrft.testing.distributed import DistributedSuite, RankPool, current_rank_context
from lrft.testing.models import tiny_causal_lm
from lrft.trainer.experience import ExperienceBatch
from lrft.trainer.logprobs import plain_response_logprobs
from lrft.trainer.micro_batches import pack_by_tokens, plan_step
from lrft.trainer.policy import PolicyUpdate, needs_old_logprob_pass
from lrft.trainer.replay import ReplayBuffer
from tests.unit.trainer.recorders import GradientRecorder
from tests.unit.trainer.samples import random_responses

CPU = torch.device("cpu")
TEMPERATURE = 0.9


def _experience(rows: int, seed: int, *, on_policy: bool = False) -> ExperienceBatch:
    """Responses of 1 to 9 tokens after prompts of 1 to 4, random advantages, old and reference
    logprobs near the model's (so the clip is active on some tokens)."""
    generator = torch.Generator().manual_seed(seed)
    sequences = random_responses(rows, generator)
    mask = sequences.action_mask
    with torch.no_grad():
        current = plain_response_logprobs(
            tiny_causal_lm(0), sequences, temperature=TEMPERATURE, device=CPU
        )
    noise = torch.randn(mask.shape, generator=generator) * 0.3
    return ExperienceBatch(
        sequences=sequences,
        old_logprobs=None if on_policy else torch.where(mask, current + noise, 0.0),
        ref_logprobs=torch.where(mask, current - noise.abs(), 0.0),
        scores=torch.zeros(rows),
        advantages=torch.randn(mask.shape, generator=generator),
    )


def _run(update: PolicyUpdate, batch: ExperienceBatch) -> list[list[Tensor]]:
    recorder = GradientRecorder(tiny_causal_lm(0))
    buffer = ReplayBuffer(seed=5)
    buffer.append(batch)
    update.run(recorder, buffer, step=0, device=CPU)  # type: ignore[arg-type]  # a stand-in
    # Only each optimizer step's last backward reduces the gradients (the others may defer).
    recorder.check_only_last_backward_syncs()
    return recorder.steps


def _relative_error(got: Tensor, expected: Tensor) -> float:
    scale = expected.double().norm().clamp(min=1e-30)
    return float((got.double() - expected.double()).norm() / scale)


LOSSES: list[tuple[str, Callable[[], PolicyLossConfig], dict[str, object]]] = [
    ("ppo", lambda: PolicyLossConfig(), {}),
    ("ppo", lambda: PolicyLossConfig(aggregation="seq-mean-token-mean"), {}),
    ("ppo", lambda: PolicyLossConfig(aggregation="seq-mean-token-sum"), {}),
    ("gspo", lambda: PolicyLossConfig(eps_clip=0.1), {}),
    ("cpgd", lambda: PolicyLossConfig(), {"use_kl_loss": True, "kl_coef": 0.3}),
    ("ppo", lambda: PolicyLossConfig(), {"entropy_coef": 0.01}),
]


@pytest.mark.parametrize(("loss_name", "loss", "extra"), LOSSES)
def test_token_budget_gradients_equal_the_fixed_micro_batches(
    loss_name: str, loss: Callable[[], PolicyLossConfig], extra: dict[str, object]
) -> None:
    batch = _experience(12, seed=1)
    settings: dict[str, object] = {
        "micro_batch_size": 3,
        "accumulation": 2,
        "epochs": 1,
        "temperature": TEMPERATURE,
        "loss": loss(),
        "loss_name": loss_name,
        **extra,
    }
    fixed = _run(PolicyUpdate(**settings), batch)  # type: ignore[arg-type]
    packed = _run(PolicyUpdate(**settings, max_tokens_per_micro_batch=20), batch)  # type: ignore[arg-type]
    assert len(fixed) == len(packed) == 2  # 12 rows / (3 x 2) per step
    for fixed_step, packed_step in zip(fixed, packed, strict=True):
        for a, b in zip(packed_step, fixed_step, strict=True):
            assert _relative_error(a, b) < 1e-5


def test_packing_changes_the_forwards() -> None:
    """The budget really regroups rows: the packed plan differs from the fixed micro-batches,
    and every row lands in exactly one forward within the budget."""
    buffer = ReplayBuffer(seed=5)
    buffer.append(_experience(12, seed=1))
    groups = buffer.row_groups(3, epoch=0)[:2]
    lengths = buffer.row_lengths()
    plan = plan_step(groups, lengths, 20)
    rows = sorted(int(r) for micro in plan for r in micro.buffer_rows)
    assert rows == sorted(int(r) for g in groups for r in g)
    assert {tuple(sorted(m.buffer_rows.tolist())) for m in plan} != {
        tuple(sorted(g.tolist())) for g in groups
    }
    for micro in plan:
        widths = lengths[micro.buffer_rows]
        assert len(widths) == 1 or len(widths) * int(widths.max()) <= 20


@pytest.mark.parametrize(
    ("lengths", "budget", "expected"),
    [
        ([5, 3, 8, 2], 10, [[2], [0, 1], [3]]),
        ([4, 4, 4, 4], 8, [[0, 1], [2, 3]]),
        ([12, 1], 10, [[0], [1]]),
        ([1, 1, 1], 100, [[0, 1, 2]]),
    ],
)
def test_pack_by_tokens_first_fit_decreasing(
    lengths: list[int], budget: int, expected: list[list[int]]
) -> None:
    assert pack_by_tokens(lengths, budget) == expected


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_parts_scaled_by_their_divisor_share_add_up_to_the_whole(mode: AggregationMode) -> None:
    generator = torch.Generator().manual_seed(0)
    losses = torch.randn(6, 5, generator=generator)
    mask = torch.rand(6, 5, generator=generator) > 0.4
    mask[2] = False  # an empty row counts in no mode
    whole = aggregate_loss(losses, mask, mode)
    parts = [torch.tensor([0, 4]), torch.tensor([1, 2]), torch.tensor([3, 5])]
    total = torch.stack(
        [
            aggregate_loss(losses[p], mask[p], mode)
            * aggregation_divisor(mask[p], mode)
            / aggregation_divisor(mask, mode)
            for p in parts
        ]
    ).sum()
    assert float(total) == pytest.approx(float(whole), rel=1e-6)


def test_high_entropy_selection_refuses_packing() -> None:
    with pytest.raises(ValueError, match=r"high_entropy_ratio .* max_tokens_per_micro_batch"):
        PolicyUpdate(
            micro_batch_size=2,
            accumulation=1,
            epochs=1,
            temperature=1.0,
            high_entropy_ratio=0.2,
            max_tokens_per_micro_batch=64,
        )
    with pytest.raises(ConfigError, match=r"high_entropy_token_ratio 0.2 .* set one of them"):
        TrainConfig(high_entropy_token_ratio=0.2, max_tokens_per_micro_batch=64)
    with pytest.raises(ConfigError, match=r"max_tokens_per_micro_batch must be a positive"):
        TrainConfig(max_tokens_per_micro_batch=0)


# ------------------------------------------------------------------ on-policy old logprobs


def test_on_policy_update_equals_one_with_a_separate_old_logprob_pass() -> None:
    """One epoch, one optimizer step: the old logprobs a separate pass would compute (the same
    model, no dropout) and the update's own detached logprobs give the same gradient."""
    on_policy = _experience(8, seed=2, on_policy=True)
    with torch.no_grad():
        old = plain_response_logprobs(
            tiny_causal_lm(0), on_policy.sequences, temperature=TEMPERATURE, device=CPU
        )
    separate = ExperienceBatch(
        sequences=on_policy.sequences,
        old_logprobs=old,
        ref_logprobs=None,
        scores=on_policy.scores,
        advantages=on_policy.advantages,
    )
    update = PolicyUpdate(micro_batch_size=4, accumulation=2, epochs=1, temperature=TEMPERATURE)
    (got,) = _run(update, on_policy)
    (expected,) = _run(update, separate)
    for a, b in zip(got, expected, strict=True):
        assert _relative_error(a, b) < 1e-5
    # and it is not trivially equal: stale old logprobs change the gradient
    stale = _experience(8, seed=2)
    (other,) = _run(update, stale)
    assert max(_relative_error(a, b) for a, b in zip(other, expected, strict=True)) > 1e-2


BASE = {"rollout_batch_size": 4, "n_samples_per_prompt": 4, "train_batch_size": 16}


@pytest.mark.parametrize(
    ("changes", "needed"),
    [
        ({}, False),
        ({"max_epochs": 2}, True),
        ({"train_batch_size": 8, "micro_train_batch_size": 8}, True),
        ({"init_kl_coef": 0.1}, True),
        ({"save_trajectories": True}, True),
    ],
)
def test_the_old_logprob_pass_is_skipped_only_when_redundant(
    changes: dict[str, object], needed: bool
) -> None:
    config = TrainConfig(**{**BASE, **changes})  # type: ignore[arg-type]
    assert needs_old_logprob_pass(config, tiny_causal_lm(0)) is needed


def test_dropout_keeps_the_old_logprob_pass() -> None:
    config = TrainConfig(**BASE)  # type: ignore[arg-type]
    model = tiny_causal_lm(0)
    model.config.attention_dropout = 0.1
    assert needs_old_logprob_pass(config, model)


# ------------------------------------------------------------------ ranks with different plans


def _fsdp2_grad_norms(budget: int | None) -> tuple[float, int]:
    """Each rank holds other rows (so packed plans differ in length across ranks): the global
    gradient norm of one step, and this rank's number of forwards."""
    from lrft.api.optim import OptimizerConfig
    from lrft.backends.train.fsdp2 import FSDP2Backend

    rank = current_rank_context().rank
    actor = FSDP2Backend().prepare_trainable(tiny_causal_lm(0), optimizer=OptimizerConfig(lr=1e-3))
    buffer = ReplayBuffer(seed=5)
    buffer.append(_experience(6, seed=10 + rank))
    forwards = 0
    original = actor.module.forward

    def counting(*args: object, **kwargs: object) -> object:
        nonlocal forwards
        forwards += 1
        return original(*args, **kwargs)

    actor.module.forward = counting
    update = PolicyUpdate(
        micro_batch_size=3,
        accumulation=2,
        epochs=1,
        temperature=TEMPERATURE,
        max_tokens_per_micro_batch=budget,
    )
    metrics = update.run(actor, buffer, step=0, device=CPU)
    return metrics["policy/grad_norm"], forwards


class TestTokenBudgetAcrossRanks(DistributedSuite):
    world_size = 2

    def test_ranks_make_equal_forwards_and_the_same_gradient(self, pool: RankPool) -> None:
        fixed = pool.run(_fsdp2_grad_norms, None)
        packed = pool.run(_fsdp2_grad_norms, 9)
        assert fixed[0][0] == pytest.approx(packed[0][0], rel=1e-5)
        assert packed[0][1] == packed[1][1]  # padded to the longest plan
        assert packed[0][1] != fixed[0][1]
