"""Policy losses: hand-computed values, gradients inside and outside the trust region."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from lrft.algo import (
    PolicyLossConfig,
    PolicyLossFn,
    PolicyLossInputs,
    cpgd_loss,
    gmpo_loss,
    gspo_loss,
    ppo_loss,
    sequence_ratio,
)
from lrft.api.errors import ConfigError
from tests.unit.algo._strategies import FAST, masks, matrices

log_ratios = st.floats(min_value=-1.0, max_value=1.0, allow_nan=False)
advantage_values = st.floats(min_value=-3.0, max_value=3.0, allow_nan=False)
eps = st.floats(min_value=0.05, max_value=0.5)


def _inputs(
    log_r: list[list[float]] | Tensor,
    advantages: list[list[float]] | Tensor,
    mask: Tensor | None = None,
    engine_minus_old: list[list[float]] | None = None,
) -> tuple[PolicyLossInputs, Tensor]:
    """Inputs whose log-ratio is ``log_r``; returns them with the leaf ``logprobs``."""
    lr = torch.as_tensor(log_r, dtype=torch.float64)
    old = -1.0 - 0.1 * torch.arange(lr.numel(), dtype=torch.float64).reshape(lr.shape)
    logprobs = (old + lr).detach().requires_grad_(True)
    engine = (
        None
        if engine_minus_old is None
        else old + torch.tensor(engine_minus_old, dtype=torch.float64)
    )
    inputs = PolicyLossInputs(
        logprobs=logprobs,
        old_logprobs=old,
        advantages=torch.as_tensor(advantages, dtype=torch.float64),
        action_mask=torch.ones(lr.shape, dtype=torch.bool) if mask is None else mask,
        engine_logprobs=engine,
    )
    return inputs, logprobs


def _grad(loss: Tensor, leaf: Tensor) -> Tensor:
    (grad,) = torch.autograd.grad(loss, leaf)
    return grad


def test_ppo_by_hand_inside_and_outside_the_clip() -> None:
    # eps 0.2. Token 0: A=1, r=1.5 -> max(-1.5, -1.2) = -1.2 (clipped, no gradient).
    # Token 1: A=-1, r=0.5 -> max(0.5, 0.8) = 0.8 (clipped). Token 2: A=1, r=1.1 -> -1.1.
    # Token 3: A=-1, r=0.9 -> 0.9. token-mean = (-1.2 + 0.8 - 1.1 + 0.9) / 4 = -0.15.
    ratios = [1.5, 0.5, 1.1, 0.9]
    inputs, leaf = _inputs([[math.log(r) for r in ratios]], [[1.0, -1.0, 1.0, -1.0]])
    out = ppo_loss(inputs, PolicyLossConfig(eps_clip=0.2))
    assert out.loss.item() == pytest.approx(-0.15)
    assert out.metrics.clip_fraction.item() == pytest.approx(0.5)
    # d/dlogp of -A r is -A r, divided by the 4 tokens of the token mean.
    torch.testing.assert_close(
        _grad(out.loss, leaf), torch.tensor([[0.0, 0.0, -1.1 / 4, 0.9 / 4]], dtype=torch.float64)
    )


def test_ppo_metrics_by_hand() -> None:
    # r = [2, 0.5]: approx_kl = mean(r - 1 - log r) = ((1 - log 2) + (-0.5 + log 2)) / 2 = 0.25.
    inputs, _ = _inputs([[math.log(2.0), math.log(0.5)]], [[1.0, 1.0]])
    metrics = ppo_loss(inputs, PolicyLossConfig()).metrics.as_floats()
    assert metrics["approx_kl"] == pytest.approx(0.25)
    assert metrics["ratio_mean"] == pytest.approx(1.25)
    assert metrics["clip_fraction"] == pytest.approx(0.5)  # only r=2 with A>0 is clipped
    assert metrics["is_weight_mean"] == 1.0
    assert metrics["is_truncated_fraction"] == 0.0


def _expected_ppo_grad(lr: float, a: float, low: float, high: float, dual: float | None) -> float:
    """d/dlogp of one PPO token loss, from the case analysis of the clipped objective."""
    r = math.exp(lr)
    if a > 0 and r > 1 + high:
        return 0.0  # clipped from above: the objective is flat
    if a < 0 and r < 1 - low:
        return 0.0  # clipped from below
    if dual is not None and a < 0 and r > dual:
        return 0.0  # the dual clip replaced the loss by the constant -A c
    return -a * r


@FAST
@given(
    st.lists(st.tuples(log_ratios, advantage_values), min_size=1, max_size=8),
    eps,
    eps,
    st.none() | st.floats(1.5, 3.0),
)
def test_ppo_gradient_matches_the_case_analysis(
    tokens: list[tuple[float, float]], low: float, high: float, dual: float | None
) -> None:
    inputs, leaf = _inputs([[t[0] for t in tokens]], [[t[1] for t in tokens]])
    config = PolicyLossConfig(eps_clip_low=low, eps_clip_high=high, dual_clip=dual)
    grad = _grad(ppo_loss(inputs, config).loss, leaf)[0].tolist()
    n = len(tokens)
    expected = [_expected_ppo_grad(lr, a, low, high, dual) / n for lr, a in tokens]
    assert grad == pytest.approx(expected, rel=1e-9, abs=1e-12)


@FAST
@given(st.data(), eps, eps)
def test_ppo_clip_is_inactive_inside_the_trust_region(
    data: st.DataObject, low: float, high: float
) -> None:
    inside = st.floats(math.log(1 - low) + 1e-6, math.log(1 + high) - 1e-6)
    lr = data.draw(st.lists(inside, min_size=1, max_size=6))
    adv = data.draw(st.lists(advantage_values, min_size=len(lr), max_size=len(lr)))
    inputs, leaf = _inputs([lr], [adv])
    out = ppo_loss(inputs, PolicyLossConfig(eps_clip_low=low, eps_clip_high=high))
    unclipped = (-inputs.advantages * torch.exp(leaf - inputs.old_logprobs)).mean()
    torch.testing.assert_close(_grad(out.loss, leaf), _grad(unclipped, leaf))
    torch.testing.assert_close(out.loss, unclipped)
    assert out.metrics.clip_fraction.item() == 0.0


@FAST
@given(st.data(), eps, eps)
def test_ppo_clip_removes_the_gradient_on_the_clipped_side(
    data: st.DataObject, low: float, high: float
) -> None:
    above = st.floats(math.log(1 + high) + 1e-6, 2.0)
    below = st.floats(-2.0, math.log(1 - low) - 1e-6)
    lr_pos = data.draw(st.lists(above, min_size=1, max_size=3))
    lr_neg = data.draw(st.lists(below, min_size=1, max_size=3))
    positive = st.floats(0.01, 3.0)
    adv = [data.draw(positive) for _ in lr_pos] + [-data.draw(positive) for _ in lr_neg]
    inputs, leaf = _inputs([lr_pos + lr_neg], [adv])
    out = ppo_loss(inputs, PolicyLossConfig(eps_clip_low=low, eps_clip_high=high))
    assert bool((_grad(out.loss, leaf) == 0).all())
    assert out.metrics.clip_fraction.item() == 1.0
    # the loss is the constant clipped surrogate: -A (1 + high) above, -A (1 - low) below
    expected = [-a * (1 + high) for a in adv[: len(lr_pos)]] + [
        -a * (1 - low) for a in adv[len(lr_pos) :]
    ]
    assert out.loss.item() == pytest.approx(sum(expected) / len(expected))


@FAST
@given(
    st.lists(st.tuples(st.floats(-2.0, 3.0), st.floats(-3.0, -0.01)), min_size=1, max_size=6),
    st.floats(1.5, 4.0),
)
def test_dual_clip_caps_the_loss_of_negative_advantages(
    tokens: list[tuple[float, float]], c: float
) -> None:
    for lr, a in tokens:
        inputs, _ = _inputs([[lr]], [[a]])
        loss = ppo_loss(inputs, PolicyLossConfig(dual_clip=c)).loss.item()
        assert loss <= -a * c + 1e-12
        if math.exp(lr) > c:
            assert loss == pytest.approx(-a * c)


def test_dual_clip_by_hand() -> None:
    # A = -1, r = 5: plain PPO gives max(5, 0.8) = 5; with c = 3 the loss is capped at 3.
    inputs, leaf = _inputs([[math.log(5.0)]], [[-1.0]])
    plain = ppo_loss(inputs, PolicyLossConfig())
    assert plain.loss.item() == pytest.approx(5.0)
    dual = ppo_loss(inputs, PolicyLossConfig(dual_clip=3.0))
    assert dual.loss.item() == pytest.approx(3.0)
    assert dual.metrics.dual_clip_fraction.item() == 1.0
    assert _grad(dual.loss, leaf).item() == 0.0


def test_decoupled_clip_higher_lets_positive_tokens_rise_further() -> None:
    # A = 1, r = 1.25: clipped with eps 0.2 (1.25 > 1.2), not with eps_clip_high 0.28 (DAPO).
    inputs, leaf = _inputs([[math.log(1.25)]], [[1.0]])
    symmetric = ppo_loss(inputs, PolicyLossConfig(eps_clip=0.2))
    assert symmetric.loss.item() == pytest.approx(-1.2)
    assert _grad(symmetric.loss, leaf).item() == 0.0
    higher = ppo_loss(inputs, PolicyLossConfig(eps_clip_low=0.2, eps_clip_high=0.28))
    assert higher.loss.item() == pytest.approx(-1.25)
    assert _grad(higher.loss, leaf).item() == pytest.approx(-1.25)


@FAST
@given(st.data(), st.integers(1, 4), st.integers(1, 6))
def test_gspo_sequence_ratio_is_the_geometric_mean_of_token_ratios(
    data: st.DataObject, rows: int, cols: int
) -> None:
    lr = data.draw(matrices(rows, cols, log_ratios))
    mask = data.draw(masks(rows, cols, nonempty_rows=True))
    inputs, _ = _inputs(lr, torch.zeros(rows, cols), mask)
    got = sequence_ratio(inputs).tolist()
    for i in range(rows):
        ratios = [math.exp(float(lr[i, t])) for t in range(cols) if bool(mask[i, t])]
        assert got[i] == pytest.approx(math.prod(ratios) ** (1 / len(ratios)), rel=1e-9)


def test_gspo_by_hand() -> None:
    # One response, log r = [0.1, 0.3]: log s = 0.2, s = e^0.2 = 1.2214028; A = 1.
    # eps 0.2: max(-1.2214, -1.2) = -1.2, clipped, no gradient.
    inputs, leaf = _inputs([[0.1, 0.3]], [[1.0, 1.0]])
    clipped = gspo_loss(inputs, PolicyLossConfig(eps_clip=0.2))
    assert clipped.loss.item() == pytest.approx(-1.2)
    assert clipped.metrics.clip_fraction.item() == 1.0
    assert bool((_grad(clipped.loss, leaf) == 0).all())
    # eps_clip_high 0.3: unclipped, loss -s; d(-s)/dlogp_t = -s / 2 for each of the 2 tokens.
    free = gspo_loss(inputs, PolicyLossConfig(eps_clip_low=0.2, eps_clip_high=0.3))
    s = math.exp(0.2)
    assert free.loss.item() == pytest.approx(-s)
    torch.testing.assert_close(
        _grad(free.loss, leaf), torch.tensor([[-s / 2, -s / 2]], dtype=torch.float64)
    )


def test_gspo_averages_over_responses_not_tokens() -> None:
    # Two responses at ratio 1 with A = 1 (3 tokens) and A = -1 (1 token): the sequence mean is
    # (-1 + 1) / 2 = 0, whereas a token mean would be (-3 + 1) / 4 = -0.5.
    mask = torch.tensor([[True, True, True], [True, False, False]])
    inputs, _ = _inputs(torch.zeros(2, 3), [[1.0] * 3, [-1.0] * 3], mask)
    assert gspo_loss(inputs, PolicyLossConfig()).loss.item() == pytest.approx(0.0)


def test_gmpo_by_hand() -> None:
    # eps 0.4 in log space. A = 1, log r = [0.1, 0.5]: min(log r, 0.4) = [0.1, 0.4], mean 0.25,
    # loss = -1 * e^0.25 = -1.2840254; token 1 is clipped (no gradient), token 0 gets
    # -A e^0.25 / 2.
    inputs, leaf = _inputs([[0.1, 0.5]], [[1.0, 1.0]])
    out = gmpo_loss(inputs, PolicyLossConfig(eps_clip=0.4))
    assert out.loss.item() == pytest.approx(-math.exp(0.25))
    torch.testing.assert_close(
        _grad(out.loss, leaf), torch.tensor([[-math.exp(0.25) / 2, 0.0]], dtype=torch.float64)
    )
    assert out.metrics.clip_fraction.item() == pytest.approx(0.5)
    # A = -1, log r = [-0.1, -0.5]: max(log r, -0.4) = [-0.1, -0.4], mean -0.25,
    # loss = -(-1) e^-0.25 = 0.7788008; token 0's gradient is e^-0.25 / 2.
    inputs, leaf = _inputs([[-0.1, -0.5]], [[-1.0, -1.0]])
    out = gmpo_loss(inputs, PolicyLossConfig(eps_clip=0.4))
    assert out.loss.item() == pytest.approx(math.exp(-0.25))
    torch.testing.assert_close(
        _grad(out.loss, leaf), torch.tensor([[math.exp(-0.25) / 2, 0.0]], dtype=torch.float64)
    )


@FAST
@given(st.lists(st.floats(-0.15, 0.15), min_size=1, max_size=6), advantage_values)
def test_gmpo_without_clipping_is_the_geometric_mean_ratio(lr: list[float], a: float) -> None:
    inputs, _ = _inputs([lr], [[a] * len(lr)])
    loss = gmpo_loss(inputs, PolicyLossConfig(eps_clip=0.2)).loss.item()
    geometric = math.prod(math.exp(x) for x in lr) ** (1 / len(lr))
    assert loss == pytest.approx(-a * geometric, rel=1e-9, abs=1e-12)


def test_cpgd_by_hand() -> None:
    # eps 0.2: bounds log 0.8 = -0.2231436, log 1.2 = 0.1823216.
    # A=1, log r=0.3 -> -min(0.3, 0.1823) = -0.1823216 (clipped); A=1, log r=0.1 -> -0.1;
    # A=-1, log r=-0.3 -> -min(0.3, 0.2231) = -0.2231436 (clipped). token-mean of the three:
    # (-0.1823216 - 0.1 - 0.2231436) / 3 = -0.1684884; only token 1 has gradient -A / 3.
    inputs, leaf = _inputs([[0.3, 0.1, -0.3]], [[1.0, 1.0, -1.0]])
    out = cpgd_loss(inputs, PolicyLossConfig(eps_clip=0.2))
    assert out.loss.item() == pytest.approx((-math.log(1.2) - 0.1 + math.log(0.8)) / 3)
    torch.testing.assert_close(
        _grad(out.loss, leaf), torch.tensor([[0.0, -1 / 3, 0.0]], dtype=torch.float64)
    )
    assert out.metrics.clip_fraction.item() == pytest.approx(2 / 3)


def test_cpgd_drift_term_by_hand() -> None:
    # A=1, log r=0.1, drift coefficient 0.5: -0.1 + 0.5 (e^0.1 - 1 - 0.1) = -0.1 + 0.0025854.
    inputs, leaf = _inputs([[0.1]], [[1.0]])
    out = cpgd_loss(inputs, PolicyLossConfig(cpgd_drift_coef=0.5))
    assert out.loss.item() == pytest.approx(-0.1 + 0.5 * (math.exp(0.1) - 1.1))
    # gradient: -A + 0.5 (e^0.1 - 1)
    assert _grad(out.loss, leaf).item() == pytest.approx(-1 + 0.5 * (math.exp(0.1) - 1))


def test_truncated_importance_sampling_by_hand() -> None:
    # old - engine = [log 3, log 0.5], cap 2: weights [min(3, 2), 0.5] = [2, 0.5].
    # At r = 1 with A = 1 the PPO token losses are -1; weighted mean (-2 - 0.5) / 2 = -1.25.
    inputs, leaf = _inputs(
        [[0.0, 0.0]], [[1.0, 1.0]], engine_minus_old=[[-math.log(3.0), math.log(2.0)]]
    )
    assert inputs.engine_logprobs is not None
    engine = inputs.engine_logprobs.clone().requires_grad_(True)
    inputs = PolicyLossInputs(
        logprobs=inputs.logprobs,
        old_logprobs=inputs.old_logprobs,
        advantages=inputs.advantages,
        action_mask=inputs.action_mask,
        engine_logprobs=engine,
    )
    out = ppo_loss(inputs, PolicyLossConfig(tis_cap=2.0))
    assert out.loss.item() == pytest.approx(-1.25)
    assert out.metrics.is_weight_mean.item() == pytest.approx(1.25)
    assert out.metrics.is_truncated_fraction.item() == pytest.approx(0.5)
    grad_logp, grad_engine = torch.autograd.grad(out.loss, [leaf, engine], allow_unused=True)
    torch.testing.assert_close(grad_logp, torch.tensor([[-1.0, -0.25]], dtype=torch.float64))
    assert grad_engine is None  # the weight is a detached constant: no path to engine_logprobs


def test_sequence_level_importance_weight_is_the_geometric_mean() -> None:
    # GSPO at r = 1, A = 1: loss -w; old - engine = [log 4, 0] gives w = sqrt(4 * 1) = 2, capped 3.
    inputs, _ = _inputs([[0.0, 0.0]], [[1.0, 1.0]], engine_minus_old=[[-math.log(4.0), 0.0]])
    assert gspo_loss(inputs, PolicyLossConfig(tis_cap=3.0)).loss.item() == pytest.approx(-2.0)
    assert gspo_loss(inputs, PolicyLossConfig(tis_cap=1.5)).loss.item() == pytest.approx(-1.5)


def test_aggregation_applies_to_token_level_losses() -> None:
    # r = 1, A = 1 everywhere: token losses -1. Rows of 2 and 1 valid tokens.
    # seq-mean-token-sum = (-2 - 1) / 2 = -1.5; seq-mean-token-sum-norm with max_len 4 = -0.375.
    mask = torch.tensor([[True, True], [True, False]])
    inputs, _ = _inputs(torch.zeros(2, 2), torch.ones(2, 2), mask)
    config = PolicyLossConfig(aggregation="seq-mean-token-sum")
    assert ppo_loss(inputs, config).loss.item() == pytest.approx(-1.5)
    config = PolicyLossConfig(aggregation="seq-mean-token-sum-norm", max_len=4)
    assert cpgd_loss(inputs, config).loss.item() == pytest.approx(0.0)  # log r = 0: -A * 0
    assert ppo_loss(inputs, config).loss.item() == pytest.approx(-0.375)


@pytest.mark.parametrize(
    ("loss", "config", "setting"),
    [
        (gspo_loss, PolicyLossConfig(dual_clip=3.0), "dual_clip"),
        (gmpo_loss, PolicyLossConfig(aggregation="token-mean"), "aggregation"),
        (gspo_loss, PolicyLossConfig(cpgd_drift_coef=0.1), "cpgd_drift_coef"),
        (ppo_loss, PolicyLossConfig(cpgd_drift_coef=0.1), "cpgd_drift_coef"),
        (cpgd_loss, PolicyLossConfig(dual_clip=2.0), "dual_clip"),
    ],
)
def test_a_setting_a_loss_does_not_read_is_rejected(
    loss: PolicyLossFn, config: PolicyLossConfig, setting: str
) -> None:
    inputs, _ = _inputs([[0.0]], [[1.0]])
    with pytest.raises(ConfigError, match=f"does not read {setting}"):
        loss(inputs, config)


def test_config_validation_names_value_and_rule() -> None:
    with pytest.raises(ConfigError, match=r"dual_clip must be > 1 .* got 0.5"):
        PolicyLossConfig(dual_clip=0.5)
    with pytest.raises(ConfigError, match=r"eps_clip_low must be in \(0, 1\), got 1.5"):
        PolicyLossConfig(eps_clip_low=1.5)
    with pytest.raises(ConfigError, match="set max_len"):
        PolicyLossConfig(aggregation="seq-mean-token-sum-norm")
    with pytest.raises(ConfigError, match="max_len=7 is read only by"):
        PolicyLossConfig(max_len=7)
    with pytest.raises(ConfigError, match="aggregation must be one of"):
        PolicyLossConfig(aggregation="mean")  # type: ignore[arg-type]


def test_importance_sampling_without_engine_logprobs_is_an_error() -> None:
    inputs, _ = _inputs([[0.0]], [[1.0]])
    for loss in (ppo_loss, gspo_loss):
        with pytest.raises(ValueError, match="tis_cap is set but no engine_logprobs"):
            loss(inputs, PolicyLossConfig(tis_cap=2.0))
