"""Every function keeps its results on the inputs' device and agrees with the CPU.

On a CPU-only machine this runs for ``cpu`` alone; where CUDA is present the same checks run on
the GPU against the CPU results (the trainer feeds these functions GPU tensors).
"""

from __future__ import annotations

import attrs
import pytest
import torch
from torch import Tensor

from lrft.algo import (
    AdvantageParams,
    PolicyLossConfig,
    PolicyLossInputs,
    RewardBatch,
    RunningMoments,
    advantage_estimators,
    clipped_value_loss,
    compute_advantages,
    dynamic_sampling_filter,
    entropy_bonus,
    fire_temperatures,
    high_entropy_token_mask,
    kl_loss,
    overlong_penalty,
    policy_losses,
)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _inputs() -> dict[str, Tensor]:
    generator = torch.Generator().manual_seed(11)
    rows, cols = 6, 5
    mask = torch.rand(rows, cols, generator=generator) < 0.8
    mask[:, 0] = True
    return {
        "mask": mask,
        "rewards": torch.randn(rows, cols, generator=generator, dtype=torch.float64),
        "values": torch.randn(rows, cols, generator=generator, dtype=torch.float64),
        "old": -torch.rand(rows, cols, generator=generator, dtype=torch.float64) * 3,
        "delta": torch.randn(rows, cols, generator=generator, dtype=torch.float64) * 0.3,
        "engine": torch.randn(rows, cols, generator=generator, dtype=torch.float64) * 0.1,
        "logits": torch.randn(rows, cols, 7, generator=generator, dtype=torch.float64),
        "groups": torch.tensor([3, 3, 8, 8, 1, 1]),
    }


def _run_all(device: str) -> dict[str, Tensor]:
    t = {k: v.to(device) for k, v in _inputs().items()}
    mask = t["mask"]
    out: dict[str, Tensor] = {}
    batch = attrs.evolve(
        RewardBatch.from_token_rewards(
            t["rewards"], mask, group_ids=t["groups"], values=t["values"]
        ),
        logprobs=t["old"],
        teacher_logprobs=t["old"] + t["delta"],
    )
    for name in advantage_estimators.names():
        out[f"adv/{name}"] = compute_advantages(name, batch, AdvantageParams(gamma=0.9)).advantages
    logp = (t["old"] + t["delta"]).requires_grad_(True)
    inputs = PolicyLossInputs(
        logprobs=logp,
        old_logprobs=t["old"],
        advantages=out["adv/group_norm"],
        action_mask=mask,
        engine_logprobs=t["old"] + t["engine"],
    )
    for name in policy_losses.names():
        loss = policy_losses.get(name).fn(inputs, PolicyLossConfig(tis_cap=1.5)).loss
        out[f"loss/{name}"] = loss
        (out[f"grad/{name}"],) = torch.autograd.grad(loss, logp)
    out["kl"] = kl_loss(logp, t["old"], mask, estimator="low_var_kl")
    out["entropy"] = entropy_bonus(t["logits"], mask)
    out["top"] = high_entropy_token_mask(t["values"], mask, 0.3)
    out["value"] = clipped_value_loss(
        t["values"], t["rewards"], t["old"], mask, value_clip=0.2
    ).loss
    out["keep"] = dynamic_sampling_filter(batch.sequence_scores, t["groups"]).keep
    out["overlong"] = overlong_penalty(mask.sum(-1), max_len=5, buffer_len=2)
    out["fire"] = fire_temperatures(mask, first_token_temperature=5.0, temperature=0.9)
    out["moments"] = RunningMoments.from_values(t["values"][mask]).to_tensor(device)
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_results_stay_on_the_input_device_and_match_the_cpu(device: str) -> None:
    got = _run_all(device)
    reference = _run_all("cpu")
    for name, value in got.items():
        assert value.device.type == device, name
        torch.testing.assert_close(value.cpu(), reference[name], msg=name)
