"""The reward-model losses against plain PyTorch references: the Bradley-Terry loss and its
gradients as a hand-written ``-logsigmoid(r_c - r_r - margin).mean()`` with autograd, scored one
sequence at a time on a plain transformers model; the verdict loss as the token mean of
``cross_entropy`` over the verdict tokens of each example alone."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lrft.demos.tokenizer import PAD_ID, build_tokenizer
from lrft.rm import JudgeExample, PairObjective, PreferencePair, VerdictObjective, bradley_terry
from tests.unit.rm.models import tiny_classifier, tiny_judge

CPU = torch.device("cpu")


def _ids(text: str) -> tuple[int, ...]:
    return tuple(build_tokenizer().encode(text, add_special_tokens=True))


PAIRS = [
    PreferencePair(chosen=_ids("12+35=47"), rejected=_ids("12+35=37"), margin=0.0),
    PreferencePair(chosen=_ids("9+9=18"), rejected=_ids("9+9=8"), margin=0.5),
    PreferencePair(chosen=_ids("1+1=2"), rejected=_ids("1+1=two, I think"), margin=0.0),
    PreferencePair(chosen=_ids("30+40=70 exactly"), rejected=_ids("30+40=80"), margin=1.5),
    PreferencePair(chosen=_ids("5+0=5"), rejected=_ids("5+0=50"), margin=0.0),
]


def test_bradley_terry_equals_the_formula_and_its_gradients() -> None:
    chosen = torch.tensor([1.0, -2.0, 0.5, 30.0, -120.0], requires_grad=True)
    rejected = torch.tensor([0.0, 1.0, 0.5, -30.0, 0.0], requires_grad=True)
    margin = torch.tensor([0.0, 0.5, 1.0, 0.0, 2.0])
    stats = bradley_terry(chosen, rejected, margin)
    torch.autograd.backward(stats.loss_sum / 5)
    mine = (chosen.grad.clone(), rejected.grad.clone())  # type: ignore[union-attr]  # set by backward
    chosen.grad, rejected.grad = None, None

    reference = -F.logsigmoid(chosen - rejected - margin).mean()
    torch.autograd.backward(reference)
    assert float(stats.loss_sum) / 5 == pytest.approx(float(reference), rel=1e-6)
    assert torch.allclose(mine[0], chosen.grad)  # type: ignore[arg-type]  # set by backward
    assert torch.allclose(mine[1], rejected.grad)  # type: ignore[arg-type]  # set by backward
    # hand-computed: d/dc -log sigmoid(x) = -(1 - sigmoid(x)), x = c - r - m, over 5 pairs
    x = 1.0 - 0.0 - 0.0
    assert float(mine[0][0]) == pytest.approx(-(1 - 1 / (1 + math.exp(-x))) / 5)
    assert math.isfinite(float(stats.loss_sum))  # a gap of -122 stays finite
    # ties count as wrong: pair 2 scores 0.5 and 0.5
    assert stats.correct == 2.0


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return grads


def test_pair_objective_in_micro_batches_has_the_plain_gradient() -> None:
    """Padded micro-batches scaled by the global count give the gradient of the global mean of
    each pair scored alone (no padding) by transformers' own forward."""
    model = tiny_classifier(seed=3)
    objective = PairObjective(pad_id=PAD_ID)
    for group in (PAIRS[:2], PAIRS[2:]):
        measured = objective.measure(model, group, CPU)
        torch.autograd.backward(measured.loss_sum / len(PAIRS))
    mine = _grads(model)

    def score(ids: tuple[int, ...]) -> torch.Tensor:
        logits: torch.Tensor = model(input_ids=torch.tensor([ids])).logits
        return logits[0, 0]

    chosen = torch.stack([score(p.chosen) for p in PAIRS])
    rejected = torch.stack([score(p.rejected) for p in PAIRS])
    margin = torch.tensor([p.margin for p in PAIRS])
    reference = -F.logsigmoid(chosen - rejected - margin).mean()
    torch.autograd.backward(reference)
    expected = _grads(model)
    assert mine.keys() == expected.keys()
    assert len(mine) > 10
    for name, grad in expected.items():
        torch.testing.assert_close(mine[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    assert any(float(g.abs().sum()) > 0 for g in expected.values())


def test_verdict_objective_is_the_token_mean_over_each_example_alone() -> None:
    model = tiny_judge(seed=5)
    tokenizer = build_tokenizer()
    examples = []
    for prompt, verdict in (
        ("judge 1+1=2: ", "\\boxed{9}"),
        ("judge 3+4=8 please: ", "no \\boxed{1}"),
    ):
        prompt_ids = tokenizer.encode(prompt)
        target = [*tokenizer.encode(verdict), tokenizer.eos_token_id]
        examples.append(
            JudgeExample(input_ids=(*prompt_ids, *target), target_start=len(prompt_ids))
        )
    objective = VerdictObjective(pad_id=PAD_ID)
    total = objective.size(examples)
    measured = objective.measure(model, examples, CPU)
    torch.autograd.backward(measured.loss_sum / total)
    mine = _grads(model)

    losses = []
    for example in examples:
        ids = torch.tensor([example.input_ids])
        logits = model(input_ids=ids).logits[0, :-1]
        token_loss = F.cross_entropy(logits, ids[0, 1:], reduction="none")
        losses.append(token_loss[example.target_start - 1 :])
    reference = torch.cat(losses).mean()
    torch.autograd.backward(reference)
    expected = _grads(model)
    assert total == sum(len(loss) for loss in losses)
    assert float(measured.loss_sum) / total == pytest.approx(float(reference), rel=1e-5)
    for name, grad in expected.items():
        torch.testing.assert_close(mine[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    assert measured.counts["examples"] == 2.0
