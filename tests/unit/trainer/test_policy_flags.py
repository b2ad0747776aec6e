"""Each policy-loss flag of ``lrft train`` reaches the loss: the trainer's micro-batch loss under
the flag equals the lrft.algo function called by hand on a small batch, with logprobs and logits
from a plain per-row forward of the model, and differs from the default loss."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest
import torch
from torch import Tensor

from lrft.algo import (
    AggregationMode,
    PolicyLossConfig,
    PolicyLossInputs,
    PolicyLossOutput,
    cpgd_loss,
    entropy_bonus,
    entropy_from_logits,
    gmpo_loss,
    gspo_loss,
    high_entropy_token_mask,
    policy_losses,
    ppo_loss,
)
from lrft.api.types import GenerationResult, StepReport
from lrft.cli import config_from_args
from lrft.testing.models import tiny_causal_lm
from lrft.trainer.experience import ExperienceBatch
from lrft.trainer.policy import PolicyUpdate
from lrft.trainer.replay import ReplayBuffer
from lrft.trainer.sequences import pack

MODEL = ["train", "--pretrain=m", "--prompt_data=p.jsonl", "--reward_fn=math", "--temperature=0.8"]
CPU = torch.device("cpu")
TEMPERATURE = 0.8
PROMPTS = [[5, 6], [7, 8, 9], [10, 11], [12], [13, 14, 15], [16, 17]]
OUTPUTS = [[20, 21, 22], [23], [24, 25, 26, 27, 28], [29, 30], [31, 32, 33, 34], [35]]
ADVANTAGES = [1.0, -0.5, 0.8, -1.2, 0.3, -0.7]


def _results() -> list[GenerationResult]:
    return [
        GenerationResult(
            request_id=str(i),
            sample_index=0,
            prompt_token_ids=prompt,
            output_token_ids=output,
            finish_reason="length",
        )
        for i, (prompt, output) in enumerate(zip(PROMPTS, OUTPUTS, strict=True))
    ]


def reference_logits(model: torch.nn.Module, first_token_temperature: float | None) -> Tensor:
    """(B, T, V): each response token's predicting logits from an unpadded forward of its row,
    divided by the temperature it was sampled at."""
    steps = max(len(o) for o in OUTPUTS)
    rows = []
    with torch.no_grad():
        for prompt, output in zip(PROMPTS, OUTPUTS, strict=True):
            logits = model(input_ids=torch.tensor([prompt + output])).logits[0].float()
            picked = logits[len(prompt) - 1 : len(prompt) - 1 + len(output)]
            scale = torch.full((len(output), 1), TEMPERATURE)
            if first_token_temperature is not None:
                scale[0] = first_token_temperature
            rows.append(torch.nn.functional.pad(picked / scale, (0, 0, 0, steps - len(output))))
    return torch.stack(rows)


def reference_logprobs(logits: Tensor, mask: Tensor) -> Tensor:
    tokens = pack(_results()).action_tokens
    chosen = torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)
    return torch.where(mask, chosen, torch.zeros_like(chosen))


@attrs.frozen(kw_only=True, eq=False)
class Case:
    model: torch.nn.Module
    batch: ExperienceBatch
    logits: Tensor  # the reference, at the rollout temperature
    fire_logits: Tensor  # the reference, first token at 3.0

    def inputs(self, *, fire: bool = False, mask: Tensor | None = None) -> PolicyLossInputs:
        logits = self.fire_logits if fire else self.logits
        valid = self.batch.sequences.action_mask
        assert self.batch.engine_logprobs is not None
        assert self.batch.old_logprobs is not None
        return PolicyLossInputs(
            logprobs=reference_logprobs(logits, valid),
            old_logprobs=self.batch.old_logprobs,
            advantages=self.batch.advantages,
            action_mask=valid if mask is None else mask,
            engine_logprobs=self.batch.engine_logprobs,
        )


@pytest.fixture(scope="module")
def case() -> Case:
    model = tiny_causal_lm(3)
    sequences = pack(_results())
    mask = sequences.action_mask
    logits = reference_logits(model, None)
    current = reference_logprobs(logits, mask)
    generator = torch.Generator().manual_seed(0)
    # Old and engine logprobs away from the current ones, so that ratios (0.3 to 3) reach every
    # clip and the importance weights both sides of a cap.
    old = current + 0.6 * torch.randn(current.shape, generator=generator)
    old[3] = current[3] - 1.0  # ratio e > 1.5 at a negative advantage: the dual clip binds
    engine = old + 0.5 * torch.randn(current.shape, generator=generator)
    advantages = torch.tensor(ADVANTAGES)[:, None].expand_as(current)
    batch = ExperienceBatch(
        sequences=sequences,
        old_logprobs=torch.where(mask, old, 0.0),
        ref_logprobs=None,
        scores=torch.zeros(len(PROMPTS)),
        advantages=torch.where(mask, advantages, 0.0),
        engine_logprobs=torch.where(mask, engine, 0.0),
    )
    return Case(model=model, batch=batch, logits=logits, fire_logits=reference_logits(model, 3.0))


def trainer_loss(case: Case, flags: list[str]) -> tuple[Tensor, dict[str, float]]:
    """The trainer's loss of the whole batch under ``lrft train`` + ``flags``."""
    update = PolicyUpdate.from_config(config_from_args([*MODEL, *flags]), world_size=1)
    loss, metrics = update.micro_batch_loss(case.model, case.batch, CPU)
    return loss.detach(), metrics


def _ppo(**settings: object) -> Callable[[PolicyLossInputs], PolicyLossOutput]:
    return lambda inputs: ppo_loss(inputs, PolicyLossConfig(**settings))  # type: ignore[arg-type]


LOSS_FLAGS: list[tuple[list[str], Callable[[PolicyLossInputs], PolicyLossOutput]]] = [
    (["--policy_loss_type=gspo"], lambda i: gspo_loss(i, PolicyLossConfig())),
    (["--policy_loss_type=gmpo"], lambda i: gmpo_loss(i, PolicyLossConfig())),
    (["--policy_loss_type=cpgd"], lambda i: cpgd_loss(i, PolicyLossConfig())),
    (["--eps_clip_low_high", "0.1", "0.4"], _ppo(eps_clip_low=0.1, eps_clip_high=0.4)),
    (["--eps_clip=0.1"], _ppo(eps_clip=0.1)),
    (["--dual_clip=1.5"], _ppo(dual_clip=1.5)),
    (["--loss_agg_mode=seq-mean-token-mean"], _ppo(aggregation="seq-mean-token-mean")),
    (["--loss_agg_mode=seq-mean-token-sum"], _ppo(aggregation="seq-mean-token-sum")),
    (
        ["--loss_agg_mode=seq-mean-token-sum-norm", "--generate_max_len=6"],
        _ppo(aggregation="seq-mean-token-sum-norm", max_len=6),
    ),
    (["--use_tis", "--tis_cap=1.2"], _ppo(tis_cap=1.2)),
    (["--use_tis"], _ppo(tis_cap=2.0)),
]


@pytest.mark.parametrize(
    ("flags", "expected"), LOSS_FLAGS, ids=[" ".join(f) for f, _ in LOSS_FLAGS]
)
def test_loss_flags_reach_the_loss(
    case: Case, flags: list[str], expected: Callable[[PolicyLossInputs], PolicyLossOutput]
) -> None:
    loss, metrics = trainer_loss(case, flags)
    want = expected(case.inputs())
    assert loss.item() == pytest.approx(want.loss.item(), rel=1e-5, abs=2e-6)
    assert metrics["clip_fraction"] == pytest.approx(want.metrics.clip_fraction.item(), abs=1e-6)
    default = ppo_loss(case.inputs(), PolicyLossConfig()).loss.item()
    assert abs(want.loss.item() - default) > 1e-3, "the batch does not tell this flag apart"


def test_every_registered_loss_is_a_choice_and_trains(case: Case) -> None:
    for name in policy_losses.names():
        loss, _ = trainer_loss(case, [f"--policy_loss_type={name}"])
        want = policy_losses.get(name).fn(case.inputs(), PolicyLossConfig())
        assert loss.item() == pytest.approx(want.loss.item(), rel=1e-5), name


def test_entropy_bonus_is_subtracted_with_its_coefficient(case: Case) -> None:
    mask = case.batch.sequences.action_mask
    bonus = entropy_bonus(case.logits, mask).item()
    plain = ppo_loss(case.inputs(), PolicyLossConfig()).loss.item()
    loss, metrics = trainer_loss(case, ["--entropy_loss_coef=0.1"])
    assert loss.item() == pytest.approx(plain - 0.1 * bonus, rel=1e-5)
    assert metrics["entropy"] == pytest.approx(bonus, rel=1e-5)
    logged_only, metrics = trainer_loss(case, ["--entropy_loss_coef=0"])
    assert logged_only.item() == pytest.approx(plain, rel=1e-5)
    assert metrics["entropy"] == pytest.approx(bonus, rel=1e-5)
    assert "entropy" not in trainer_loss(case, [])[1]  # not computed by default


def test_entropy_is_aggregated_like_the_loss(case: Case) -> None:
    mask = case.batch.sequences.action_mask
    mode: AggregationMode = "seq-mean-token-sum"
    bonus = entropy_bonus(case.logits, mask, aggregation=mode).item()
    plain = ppo_loss(case.inputs(), PolicyLossConfig(aggregation=mode)).loss.item()
    loss, _ = trainer_loss(case, ["--entropy_loss_coef=0.2", f"--loss_agg_mode={mode}"])
    assert loss.item() == pytest.approx(plain - 0.2 * bonus, rel=1e-5)


def test_high_entropy_tokens_are_the_only_ones_trained(case: Case) -> None:
    mask = case.batch.sequences.action_mask
    selected = high_entropy_token_mask(entropy_from_logits(case.logits, mask), mask, 0.3)
    assert 0 < int(selected.sum()) < int(mask.sum())
    want = ppo_loss(case.inputs(mask=selected), PolicyLossConfig()).loss.item()
    loss, _ = trainer_loss(case, ["--high_entropy_token_ratio=0.3"])
    assert loss.item() == pytest.approx(want, rel=1e-5)
    assert abs(want - ppo_loss(case.inputs(), PolicyLossConfig()).loss.item()) > 1e-3


def test_fire_scores_the_first_token_at_its_temperature(case: Case) -> None:
    flags = ["--use_fire_sampling", "--fire_first_token_temperature=3"]
    want = ppo_loss(case.inputs(fire=True), PolicyLossConfig()).loss.item()
    loss, _ = trainer_loss(case, flags)
    assert loss.item() == pytest.approx(want, rel=1e-5)
    assert abs(want - ppo_loss(case.inputs(), PolicyLossConfig()).loss.item()) > 1e-3
    # with the entropy (the full-logits path) the temperatures are the same
    mask = case.batch.sequences.action_mask
    bonus = entropy_bonus(case.fire_logits, mask).item()
    loss, metrics = trainer_loss(case, [*flags, "--entropy_loss_coef=0.1"])
    assert loss.item() == pytest.approx(want - 0.1 * bonus, rel=1e-5)
    assert metrics["entropy"] == pytest.approx(bonus, rel=1e-5)


class _Recorder:
    """A TrainableModel stand-in: runs the module, records what reaches ``backward``."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.losses: list[float] = []

    def backward(self, loss: Tensor, *, sync_gradients: bool = True) -> None:
        self.losses.append(loss.item())

    def step(self) -> StepReport:
        return StepReport(optimizer_steps=1, grad_norm=0.0, skipped=False, lr=0.0)


def test_run_backpropagates_the_configured_loss(case: Case) -> None:
    flags = ["--policy_loss_type=cpgd", "--entropy_loss_coef=0.1"]
    update = PolicyUpdate.from_config(config_from_args([*MODEL, *flags]), world_size=1)
    update = attrs.evolve(update, micro_batch_size=len(PROMPTS), accumulation=1, epochs=2)
    buffer = ReplayBuffer(seed=0)
    buffer.append(case.batch)
    actor = _Recorder(case.model)
    metrics = update.run(actor, buffer, step=0, device=CPU)  # type: ignore[arg-type]  # records backward only
    mask = case.batch.sequences.action_mask
    want = cpgd_loss(case.inputs(), PolicyLossConfig()).loss.item()
    want -= 0.1 * entropy_bonus(case.logits, mask).item()
    assert actor.losses == pytest.approx([want] * 2, rel=1e-5)
    assert metrics["policy/entropy"] == pytest.approx(entropy_bonus(case.logits, mask).item())
