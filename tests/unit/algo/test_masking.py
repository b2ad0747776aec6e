"""Padding never influences a result: garbage (NaN, inf, huge) at masked positions changes no
output, no loss and no gradient, and masked positions get exactly zero gradient."""

from __future__ import annotations

import attrs
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from lrft.algo import (
    AGGREGATION_MODES,
    AdvantageParams,
    PolicyLossConfig,
    PolicyLossInputs,
    RewardBatch,
    advantage_estimators,
    aggregate_loss,
    clipped_value_loss,
    compute_advantages,
    entropy_from_logits,
    high_entropy_token_mask,
    kl_estimators,
    kl_loss,
    policy_losses,
)
from tests.unit.algo._strategies import FAST, GARBAGE, masks, matrices, scramble

garbage = st.sampled_from(GARBAGE)


@FAST
@given(
    st.data(),
    st.integers(1, 3),
    st.integers(1, 5),
    garbage,
    st.sampled_from(sorted(advantage_estimators.names())),
)
def test_advantages_ignore_padding(
    data: st.DataObject, groups: int, cols: int, junk: float, name: str
) -> None:
    rows = 2 * groups
    rewards = data.draw(matrices(rows, cols))
    values = data.draw(matrices(rows, cols))
    student, teacher = data.draw(matrices(rows, cols)), data.draw(matrices(rows, cols))
    mask = data.draw(masks(rows, cols))
    params = AdvantageParams(gamma=0.9, lambd=0.8)

    def run(r: Tensor, v: Tensor, s: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
        batch = RewardBatch.from_token_rewards(r, mask, group_size=2, values=v)
        batch = attrs.evolve(batch, logprobs=s, teacher_logprobs=t)
        out = compute_advantages(name, batch, params)
        return out.advantages, out.returns

    clean = run(rewards, values, student, teacher)
    dirty = run(*(scramble(m, mask, junk) for m in (rewards, values, student, teacher)))
    for a, b in zip(clean, dirty, strict=True):
        assert torch.equal(a, b)
        assert bool((a[~mask] == 0).all())


def _loss_and_grads(
    name: str,
    config: PolicyLossConfig,
    logp: Tensor,
    old: Tensor,
    adv: Tensor,
    eng: Tensor,
    mask: Tensor,
) -> tuple[Tensor, Tensor]:
    leaf = logp.clone().requires_grad_(True)
    inputs = PolicyLossInputs(
        logprobs=leaf, old_logprobs=old, advantages=adv, action_mask=mask, engine_logprobs=eng
    )
    loss = policy_losses.get(name).fn(inputs, config).loss
    (grad,) = torch.autograd.grad(loss, leaf)
    return loss.detach(), grad


@FAST
@given(
    st.data(),
    st.integers(1, 4),
    st.integers(1, 5),
    garbage,
    st.sampled_from(sorted(policy_losses.names())),
)
def test_policy_losses_ignore_padding(
    data: st.DataObject, rows: int, cols: int, junk: float, name: str
) -> None:
    small = st.floats(-0.5, 0.5)
    old = data.draw(matrices(rows, cols, st.floats(-5.0, -0.1)))
    logp = old + data.draw(matrices(rows, cols, small))
    eng = old + data.draw(matrices(rows, cols, small))
    adv = data.draw(matrices(rows, cols))
    mask = data.draw(masks(rows, cols))
    config = PolicyLossConfig(tis_cap=1.2)
    clean_loss, clean_grad = _loss_and_grads(name, config, logp, old, adv, eng, mask)
    dirty_loss, dirty_grad = _loss_and_grads(
        name,
        config,
        scramble(logp, mask, junk),
        scramble(old, mask, -junk),
        scramble(adv, mask, junk),
        scramble(eng, mask, junk),
        mask,
    )
    assert torch.equal(clean_loss, dirty_loss)
    assert torch.equal(clean_grad, dirty_grad)
    assert bool(torch.isfinite(dirty_grad).all())
    assert bool((dirty_grad[~mask] == 0).all())


@FAST
@given(st.data(), st.integers(1, 4), st.integers(1, 5), garbage)
def test_aggregation_kl_and_value_loss_ignore_padding(
    data: st.DataObject, rows: int, cols: int, junk: float
) -> None:
    a = data.draw(matrices(rows, cols))
    b = data.draw(matrices(rows, cols))
    c = data.draw(matrices(rows, cols))
    mask = data.draw(masks(rows, cols))
    dirty = [scramble(x, mask, junk) for x in (a, b, c)]
    for mode in AGGREGATION_MODES:
        assert torch.equal(
            aggregate_loss(a, mask, mode, max_len=8),  # type: ignore[arg-type]
            aggregate_loss(dirty[0], mask, mode, max_len=8),  # type: ignore[arg-type]
        )
    for estimator in kl_estimators.names():
        assert torch.equal(
            kl_loss(a, b, mask, estimator=estimator),
            kl_loss(dirty[0], dirty[1], mask, estimator=estimator),
        )
    for clip in (None, 0.3):
        clean = clipped_value_loss(a, b, c, mask, value_clip=clip)
        noisy = clipped_value_loss(dirty[0], dirty[1], dirty[2], mask, value_clip=clip)
        assert torch.equal(clean.loss, noisy.loss)
        assert torch.equal(clean.clip_fraction, noisy.clip_fraction)
    assert torch.equal(
        high_entropy_token_mask(a, mask, 0.5), high_entropy_token_mask(dirty[0], mask, 0.5)
    )


@pytest.mark.parametrize("junk", GARBAGE)
def test_entropy_ignores_padded_logits_including_their_gradient(junk: float) -> None:
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 3, 5, generator=generator)
    mask = torch.tensor([[True, True, False], [False, True, False]])
    dirty = torch.where(mask.unsqueeze(-1), logits, torch.full_like(logits, junk))
    grads = []
    for source in (logits, dirty):
        leaf = source.clone().requires_grad_(True)
        entropy = entropy_from_logits(leaf, mask)
        (grad,) = torch.autograd.grad(entropy.sum(), leaf)
        grads.append((entropy.detach(), grad))
    assert torch.equal(grads[0][0], grads[1][0])
    assert torch.equal(grads[0][1], grads[1][1])
    assert bool((grads[1][1][~mask] == 0).all())
