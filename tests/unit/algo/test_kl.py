"""KL estimators against closed forms and Monte-Carlo truth; the KL controllers."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lrft.algo import (
    AdaptiveKLController,
    FixedKLController,
    k1,
    k2,
    k3,
    kl_loss,
    kl_penalized_rewards,
    low_var_kl,
    token_kl,
)
from lrft.api.errors import ConfigError
from tests.unit.algo._strategies import FAST

logprob_pairs = st.tuples(st.floats(-30.0, 0.0), st.floats(-30.0, 0.0))


@FAST
@given(st.lists(logprob_pairs, min_size=1, max_size=10))
def test_estimators_equal_their_closed_forms(pairs: list[tuple[float, float]]) -> None:
    logp = torch.tensor([p for p, _ in pairs], dtype=torch.float64)
    ref = torch.tensor([q for _, q in pairs], dtype=torch.float64)
    for got_1, got_2, got_3, (p, q) in zip(
        k1(logp, ref).tolist(), k2(logp, ref).tolist(), k3(logp, ref).tolist(), pairs, strict=True
    ):
        assert got_1 == pytest.approx(p - q, abs=1e-12)
        assert got_2 == pytest.approx(0.5 * (p - q) ** 2, rel=1e-12, abs=1e-12)
        # k3 = pi_ref / pi - 1 - log(pi_ref / pi)
        assert got_3 == pytest.approx(math.exp(q - p) - 1 - (q - p), rel=1e-9, abs=1e-12)
        assert got_3 >= 0.0


@FAST
@given(st.lists(st.floats(-50.0, 50.0), min_size=1, max_size=10))
def test_k3_is_never_negative(log_ratios: list[float]) -> None:
    x = torch.tensor(log_ratios, dtype=torch.float64)
    assert bool((k3(torch.zeros_like(x), x) >= 0).all())


def test_low_var_kl_is_k3_clamped() -> None:
    logp = torch.tensor([-1.0, -1.0, 0.0], dtype=torch.float64)
    ref = torch.tensor([-1.5, -0.2, -40.0], dtype=torch.float64)
    torch.testing.assert_close(low_var_kl(logp, ref)[:2], k3(logp, ref)[:2])
    # x = ref - logp = -40 is clamped to -20: e^-20 - 1 + 20 = 19.0000000021, then capped at 10.
    assert low_var_kl(logp, ref)[2].item() == 10.0
    # and x = +30 (reference far more likely) caps at 10 instead of e^30.
    assert low_var_kl(torch.tensor([-30.0]), torch.tensor([0.0])).item() == 10.0


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(2, 6))
def test_k1_and_k3_means_estimate_the_true_kl(seed: int, vocab: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    logits_p = torch.randn(vocab, generator=generator, dtype=torch.float64)
    logits_q = torch.randn(vocab, generator=generator, dtype=torch.float64)
    log_p, log_q = torch.log_softmax(logits_p, 0), torch.log_softmax(logits_q, 0)
    true_kl = float((log_p.exp() * (log_p - log_q)).sum())  # KL(p || q), exact
    samples = torch.multinomial(log_p.exp(), 20_000, replacement=True, generator=generator)
    for estimator in (k1, k3):
        values = estimator(log_p[samples], log_q[samples])
        standard_error = float(values.std()) / math.sqrt(values.numel())
        assert float(values.mean()) == pytest.approx(true_kl, abs=6 * standard_error + 1e-9)


def test_token_kl_is_masked_and_uses_the_registry() -> None:
    logp = torch.tensor([[-1.0, -2.0, math.nan]])
    ref = torch.tensor([[-1.5, -1.0, math.inf]])
    mask = torch.tensor([[True, True, False]])
    torch.testing.assert_close(token_kl(logp, ref, mask, "k1"), torch.tensor([[0.5, -1.0, 0.0]]))
    with pytest.raises(ConfigError, match="unknown KL estimator 'k4'; known: 'k1', 'k2', 'k3'"):
        token_kl(logp, ref, mask, "k4")


def test_kl_penalized_rewards_by_hand() -> None:
    # r = [0, 0, 1], kl = [0.1, -0.2, 0.3], coef 0.5: [-0.05, 0.1, 0.85]; padding stays 0.
    rewards = torch.tensor([[0.0, 0.0, 1.0, 7.0]])
    kl = torch.tensor([[0.1, -0.2, 0.3, math.nan]])
    mask = torch.tensor([[1, 1, 1, 0]])
    torch.testing.assert_close(
        kl_penalized_rewards(rewards, kl, mask, 0.5), torch.tensor([[-0.05, 0.1, 0.85, 0.0]])
    )


def test_kl_loss_gradient_by_hand() -> None:
    # k3 = e^(q - p) - 1 - (q - p); d/dp = 1 - e^(q - p). Two valid tokens, token-mean halves it.
    logp = torch.tensor([[-1.0, -2.0, 0.0]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False]])
    loss = kl_loss(logp, ref, mask, estimator="k3")
    expected = ((math.exp(-0.5) - 1 + 0.5) + (math.exp(1.0) - 1 - 1.0)) / 2
    assert loss.item() == pytest.approx(expected)
    (grad,) = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(
        grad,
        torch.tensor(
            [[(1 - math.exp(-0.5)) / 2, (1 - math.exp(1.0)) / 2, 0.0]], dtype=torch.float64
        ),
    )


def test_adaptive_controller_by_hand() -> None:
    # Ziegler et al. 2019: e = clip(KL / target - 1, -0.2, 0.2); beta *= 1 + e * n / horizon.
    controller = AdaptiveKLController(value=0.1, target=6.0, horizon=10_000)
    # KL 9: e = 0.5 -> 0.2; beta = 0.1 * (1 + 0.2 * 256 / 10000) = 0.100512
    assert controller.update(9.0, 256).value == pytest.approx(0.100512)
    # KL 3: e = -0.5 -> -0.2; beta = 0.1 * (1 - 0.00512) = 0.099488
    assert controller.update(3.0, 256).value == pytest.approx(0.099488)
    # KL 6.6: e = 0.1 (inside the clip); beta = 0.1 * (1 + 0.1 * 0.0256) = 0.100256
    assert controller.update(6.6, 256).value == pytest.approx(0.100256)
    assert controller.value == 0.1  # immutable: update returns a new controller


@FAST
@given(
    st.floats(1e-4, 1.0),
    st.floats(0.1, 20.0),
    st.integers(1, 100_000),
    st.lists(st.tuples(st.floats(0.0, 50.0), st.floats(0.0, 1.0)), max_size=8),
)
def test_adaptive_controller_follows_the_published_update(
    beta: float, target: float, horizon: int, steps: list[tuple[float, float]]
) -> None:
    controller = AdaptiveKLController(value=beta, target=target, horizon=horizon)
    expected = beta
    for kl, share in steps:
        n = round(share * horizon)
        error = kl / target - 1
        error = 0.2 if error > 0.2 else (-0.2 if error < -0.2 else error)
        expected = expected * (1 + error * n / horizon)
        controller = controller.update(kl, n)
        assert controller.value == pytest.approx(expected, rel=1e-12)
        assert controller.value > 0


def test_fixed_controller_never_moves() -> None:
    controller = FixedKLController(value=0.05)
    assert controller.update(100.0, 1000).value == 0.05


def test_an_update_may_not_span_more_than_one_horizon() -> None:
    # With e = -0.2, n = 6 horizons would give the multiplier 1 - 1.2 < 0: a negative KL coefficient.
    controller = AdaptiveKLController(value=0.1, target=1.0, horizon=10)
    with pytest.raises(ValueError, match=r"n_steps must be in \[0, horizon=10\], got 60"):
        controller.update(0.0, 60)


def test_controller_validation() -> None:
    with pytest.raises(ConfigError, match="horizon must be a positive integer, got 0"):
        AdaptiveKLController(value=0.1, target=1.0, horizon=0)
    with pytest.raises(ConfigError, match=r"target must be > 0, got -1\.0"):
        AdaptiveKLController(value=0.1, target=-1.0, horizon=10)
