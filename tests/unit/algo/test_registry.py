"""Registries keyed by CLI name: built-ins, user additions, duplicates and unknown names."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
import torch
from torch import Tensor

from lrft.algo import (
    AdvantageParams,
    Advantages,
    PolicyLossConfig,
    PolicyLossInputs,
    PolicyLossOutput,
    Registry,
    RewardBatch,
    advantage_estimators,
    compute_advantages,
    kl_estimators,
    policy_losses,
    ppo_loss,
    register_advantage_estimator,
    register_kl_estimator,
    register_policy_loss,
    token_kl,
)
from lrft.algo import registry as registry_module
from lrft.api.errors import ConfigError


@pytest.fixture
def cleanup() -> Iterator[list[tuple[str, str]]]:
    """Names registered by a test, removed afterwards so tests stay independent."""
    added: list[tuple[str, str]] = []
    yield added
    registries: dict[str, Registry[Any]] = {
        "advantage": advantage_estimators,
        "loss": policy_losses,
        "kl": kl_estimators,
    }
    for kind, name in added:
        registry = registries[kind]
        if name in registry:
            registry.remove(name)


def _builtin(registry: Registry[Any]) -> tuple[str, ...]:
    """The names lrft itself registers (a test's --plugins module may have added others)."""
    return tuple(spec.name for spec in registry if spec.fn.__module__.startswith("lrft."))


def test_builtin_names() -> None:
    assert _builtin(advantage_estimators) == (
        "cpgd", "dr_grpo", "gae", "group_norm", "on_policy_distillation",
        "on_policy_distillation_hybrid", "reinforce", "reinforce++", "reinforce_baseline", "rloo",
    )  # fmt: skip
    assert _builtin(policy_losses) == ("cpgd", "gmpo", "gspo", "ppo")
    assert _builtin(kl_estimators) == ("k1", "k2", "k3", "low_var_kl")


def test_builtin_declarations() -> None:
    # REINFORCE++ (and its baseline variant) and PPO's GAE whiten over the batch; group-relative
    # estimators are already normalised per group (or, for Dr. GRPO, deliberately not scaled).
    whiten = {
        spec.name: spec.whiten
        for spec in advantage_estimators
        if spec.name in _builtin(advantage_estimators)
    }
    assert whiten == {
        "gae": True, "reinforce++": True, "reinforce_baseline": True, "reinforce": False,
        "rloo": False, "group_norm": False, "dr_grpo": False, "cpgd": False,
        "on_policy_distillation": False, "on_policy_distillation_hybrid": False,
    }  # fmt: skip
    assert [s.name for s in advantage_estimators if s.needs_values] == ["gae"]
    assert {s.name for s in policy_losses if s.sequence_level} == {"gspo", "gmpo"}
    assert all(spec.description for spec in advantage_estimators)


def test_unknown_names_raise_config_error_listing_the_known_ones() -> None:
    with pytest.raises(ConfigError) as info:
        advantage_estimators.get("grpo")
    message = str(info.value)
    assert message.startswith("unknown advantage estimator 'grpo'; known: ")
    assert all(repr(name) in message for name in advantage_estimators.names())
    with pytest.raises(ConfigError, match="unknown policy loss 'dapo'; known: 'cpgd', 'gmpo'"):
        policy_losses.get("dapo")
    with pytest.raises(ConfigError, match="unknown advantage estimator 'nope'"):
        compute_advantages(
            "nope", RewardBatch(token_rewards=torch.zeros(1, 1), action_mask=torch.ones(1, 1))
        )


def test_duplicate_names_raise() -> None:
    with pytest.raises(ValueError, match="advantage estimator 'gae' is already registered"):
        register_advantage_estimator("gae", advantage_estimators.get("rloo").fn, whiten=False)
    with pytest.raises(ValueError, match="policy loss 'ppo' is already registered"):
        register_policy_loss("ppo", ppo_loss)
    with pytest.raises(ValueError, match="KL estimator 'k1' is already registered"):
        register_kl_estimator("k1", lambda logp, ref: logp - ref)
    with pytest.raises(ValueError, match="name must be non-empty without spaces"):
        register_policy_loss("my loss", ppo_loss)


def test_user_estimator_by_call_with_declared_needs(cleanup: list[tuple[str, str]]) -> None:
    def last_token_only(batch: RewardBatch, params: AdvantageParams) -> Advantages:
        """A = the token rewards themselves, unwhitened."""
        return Advantages(
            advantages=batch.token_rewards,
            returns=batch.token_rewards,
            action_mask=batch.action_mask,
        )

    returned = register_advantage_estimator(
        "test_raw", last_token_only, whiten=True, needs_groups=True
    )
    cleanup.append(("advantage", "test_raw"))
    assert returned is last_token_only
    batch = RewardBatch(token_rewards=torch.tensor([[1.0, 3.0]]), action_mask=torch.ones(1, 2))
    with pytest.raises(ConfigError, match="'test_raw' needs prompt groups"):
        compute_advantages("test_raw", batch)
    grouped = RewardBatch.from_token_rewards(batch.token_rewards, batch.action_mask, group_size=1)
    # whiten=True: [1, 3] -> mean 2, sample std sqrt(2) -> [-1/sqrt 2, 1/sqrt 2]
    got = compute_advantages("test_raw", grouped).advantages
    torch.testing.assert_close(got, torch.tensor([[-(0.5**0.5), 0.5**0.5]]), atol=1e-6, rtol=0)


def test_gae_without_values_is_a_config_error() -> None:
    batch = RewardBatch(token_rewards=torch.zeros(1, 2), action_mask=torch.ones(1, 2))
    with pytest.raises(ConfigError, match="'gae' needs critic values"):
        compute_advantages("gae", batch)


def test_user_policy_loss_and_kl_estimator_by_decorator(cleanup: list[tuple[str, str]]) -> None:
    @register_policy_loss("test_vanilla_pg")
    def vanilla(inputs: PolicyLossInputs, config: PolicyLossConfig) -> PolicyLossOutput:
        """REINFORCE surrogate -A log pi, via PPO's metrics."""
        out = ppo_loss(inputs, config)
        loss = -(inputs.advantages * inputs.logprobs)[inputs.action_mask].mean()
        return PolicyLossOutput(loss=loss, metrics=out.metrics)

    @register_kl_estimator("test_abs")
    def absolute(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
        """|log pi - log pi_ref|."""
        return (logprobs - ref_logprobs).abs()

    cleanup.extend([("loss", "test_vanilla_pg"), ("kl", "test_abs")])
    logprobs = torch.tensor([[-1.0, -2.0]])
    inputs = PolicyLossInputs(
        logprobs=logprobs, old_logprobs=logprobs, advantages=torch.tensor([[1.0, 2.0]]),
        action_mask=torch.ones(1, 2),
    )  # fmt: skip
    loss = policy_losses.get("test_vanilla_pg").fn(inputs, PolicyLossConfig()).loss
    assert loss.item() == pytest.approx(-(1.0 * -1.0 + 2.0 * -2.0) / 2)
    kl = token_kl(logprobs, torch.tensor([[-1.5, -1.0]]), torch.ones(1, 2), "test_abs")
    torch.testing.assert_close(kl, torch.tensor([[0.5, 1.0]]))


def test_the_documented_example_runs(cleanup: list[tuple[str, str]]) -> None:
    doc = registry_module.__doc__
    assert doc is not None
    block = doc.split("::\n", 1)[1].split("\n\nA second registration", 1)[0]
    namespace: dict[str, object] = {}
    cleanup.append(("advantage", "max_baseline"))
    exec(textwrap.dedent(block), namespace)  # the example as a user would paste it
    result = namespace["result"]
    assert isinstance(result, Advantages)
    # scores [1, 0 | 0.5, 0.5]: group maxima 1 and 0.5 -> [0, -1, 0, 0] on every token
    torch.testing.assert_close(result.advantages[:, 0], torch.tensor([0.0, -1.0, 0.0, 0.0]))
    assert not advantage_estimators.get("max_baseline").whiten


_ALTERNATIVES: dict[str, tuple[object, object]] = {
    "gamma": (1.0, 0.5),
    "lambd": (1.0, 0.5),
    "group_std_eps": (1e-6, 0.5),
    "cpgd_weight": ("std", "equal"),
    "opd_kl_coef": (1.0, 0.5),
}


@pytest.mark.parametrize("name", sorted(advantage_estimators.names()))
def test_builtin_estimators_read_exactly_the_parameters_they_declare(name: str) -> None:
    # No dead flags: changing a declared parameter changes the output on this batch, changing an
    # undeclared one changes nothing.
    assert set(_ALTERNATIVES) == {field.name for field in attrs.fields(AdvantageParams)}
    spec = advantage_estimators.get(name)
    mask = torch.ones(4, 3, dtype=torch.bool)
    batch = RewardBatch.from_sequence_rewards(
        torch.tensor([3.0, 0.0, 1.0, 2.0]),
        mask,
        group_size=2,
        values=torch.tensor([[0.5, 0.1, 0.2]]).expand(4, 3),
    )
    batch = attrs.evolve(
        batch,
        logprobs=torch.tensor([[-0.5, -1.0, -2.0]]).expand(4, 3),
        teacher_logprobs=torch.tensor([[-1.5, -0.25, -2.0]]).expand(4, 3),
    )
    for field, (first, second) in _ALTERNATIVES.items():
        a = spec.fn(batch, AdvantageParams(**{field: first}))  # type: ignore[arg-type]
        b = spec.fn(batch, AdvantageParams(**{field: second}))  # type: ignore[arg-type]
        changed = not torch.equal(a.advantages, b.advantages)
        assert changed == (field in spec.reads), f"{name} and {field}"


def test_declaring_an_unknown_parameter_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"reads unknown parameters \['lambda'\]"):
        register_advantage_estimator(
            "test_typo", advantage_estimators.get("gae").fn, whiten=True, reads=("lambda",)
        )
    assert "test_typo" not in advantage_estimators
