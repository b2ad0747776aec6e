"""The single-process reference and the comparisons that ``TrainBackendSuite`` is built from.

The reference is a plain PyTorch copy of the model, trained on the whole batch with
``torch.optim.AdamW``, ``clip_grad_norm_`` and ``SchedulerConfig.multiplier``: what every
backend must reproduce whatever it shards.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from lrft.api.optim import OptimizerConfig, SchedulerConfig
from lrft.testing.models import random_token_batch

# AdamW's update is scale-free where |grad| >> eps: a gradient element that is a near-cancelling
# sum (or, like a key bias's, exactly zero in exact arithmetic) moves its parameter by about lr
# whatever its rounding error, so two exact-in-math summation orders can disagree by ~lr. A
# large eps bounds that sensitivity (the update changes by at most lr * error / eps), keeping fp32
# parity within 1e-5 while a rank that trains on its own data alone is still off by ~lr = 1e-3.
OPTIMIZER = OptimizerConfig(
    lr=1e-3, betas=(0.9, 0.95), eps=1e-3, weight_decay=0.1, max_grad_norm=1.0
)
# A warm-up makes the learning rate differ at every step: a scheduler that does not advance, or
# advances on a skipped step, or is not restored from a checkpoint, changes the result.
SCHEDULE = SchedulerConfig(kind="cosine", warmup_steps=2, total_steps=6, min_lr_ratio=0.1)
PARITY_ATOL = 1e-5
SEQUENCE_LENGTH = 12


def batch(seed: int, size: int, device: torch.device) -> torch.Tensor:
    """The whole batch (the same on every rank)."""
    return random_token_batch(seed, size, SEQUENCE_LENGTH).to(device)


def rank_share(tokens: torch.Tensor) -> torch.Tensor:
    """This rank's equal, contiguous share of ``tokens`` along the batch dimension."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if tokens.shape[0] % world:
        raise ValueError(f"batch of {tokens.shape[0]} does not split into {world} equal shares")
    share = tokens.shape[0] // world
    return tokens[rank * share : (rank + 1) * share]


def lm_loss(module: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over every position of ``tokens``."""
    logits = module(input_ids=tokens).logits
    vocab = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, vocab).float(), tokens[:, 1:].reshape(-1))


class Reference:
    """The plain single-process run the backend is compared with."""

    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device,
        optimizer: OptimizerConfig = OPTIMIZER,
        schedule: SchedulerConfig = SCHEDULE,
    ) -> None:
        self.model = model.to(device)
        self.config, self.schedule = optimizer, schedule
        self.optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=optimizer.lr,
            betas=optimizer.betas,
            eps=optimizer.eps,
            weight_decay=optimizer.weight_decay,
        )
        self.steps = 0

    def step(self, tokens: torch.Tensor) -> tuple[float, float]:
        """One optimizer step on the whole batch; returns (gradient norm, learning rate)."""
        return self.step_on(lambda model: lm_loss(model, tokens))

    def step_on(self, loss_of: Callable[[torch.nn.Module], torch.Tensor]) -> tuple[float, float]:
        """One optimizer step on ``loss_of(model)``; returns (gradient norm, learning rate)."""
        lr = self.config.lr * self.schedule.multiplier(self.steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        torch.autograd.backward(loss_of(self.model))
        # an infinite bound measures the norm without clipping
        bound = self.config.max_grad_norm if self.config.max_grad_norm > 0 else math.inf
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), bound)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return float(norm), lr

    def parameters(self) -> dict[str, torch.Tensor]:
        return {name: p.detach() for name, p in self.model.named_parameters()}


def host_copies(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: t.detach().to("cpu", copy=True) for name, t in tensors.items()}


def check_names(actual: Sequence[str], expected: Sequence[str], what: str) -> None:
    duplicates = sorted({name for name in actual if list(actual).count(name) > 1})
    missing = sorted(set(expected) - set(actual))
    unexpected = sorted(set(actual) - set(expected))
    if duplicates or missing or unexpected:
        raise AssertionError(
            f"{what}: names do not match the plain model's named_parameters(): "
            f"missing {missing}, unexpected {unexpected}, more than once {duplicates}"
        )


def max_abs_diff(
    actual: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], what: str
) -> tuple[float, str]:
    """The largest absolute difference over equally named tensors, and where it is."""
    check_names(list(actual), list(expected), what)
    worst, where = 0.0, ""
    for name, want in expected.items():
        got = actual[name]
        if tuple(got.shape) != tuple(want.shape):
            raise AssertionError(
                f"{what}: {name} has shape {tuple(got.shape)}, expected {tuple(want.shape)}"
            )
        diff = (got.detach().double().cpu() - want.detach().double().cpu()).abs().max().item()
        if not diff <= worst:  # also catches NaN
            worst, where = diff, name
    return worst, where


def assert_close(
    actual: Mapping[str, torch.Tensor],
    expected: Mapping[str, torch.Tensor],
    what: str,
    *,
    atol: float = PARITY_ATOL,
) -> float:
    worst, where = max_abs_diff(actual, expected, what)
    if not worst <= atol:
        raise AssertionError(
            f"{what} differ from the single-process reference: max abs diff {worst:.3e} "
            f"in {where} (tolerance {atol:.0e})"
        )
    return worst


def assert_identical(
    actual: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], what: str
) -> None:
    check_names(list(actual), list(expected), what)
    changed = [
        name
        for name in expected
        if actual[name].dtype != expected[name].dtype
        or not torch.equal(actual[name].cpu(), expected[name].cpu())
    ]
    if changed:
        worst, where = max_abs_diff(actual, expected, what)
        raise AssertionError(
            f"{what} are not bit-identical: {len(changed)} tensor(s) changed, e.g. {changed[:3]}; "
            f"max abs diff {worst:.3e} in {where}"
        )


def check_report_matches(
    report_norm: float,
    report_lr: float,
    reference: tuple[float, float],
    step: int,
    schedule: SchedulerConfig = SCHEDULE,
) -> None:
    norm, lr = reference
    if not math.isclose(report_lr, lr, rel_tol=1e-9):
        raise AssertionError(
            f"step {step}: StepReport.lr is {report_lr!r}, the schedule says {lr!r} ({schedule})"
        )
    if math.isnan(norm) and math.isnan(report_norm):
        return  # the caller checks the learning rate alone
    if not math.isclose(report_norm, norm, rel_tol=1e-4):
        raise AssertionError(
            f"step {step}: StepReport.grad_norm is {report_norm!r}, the reference's global "
            f"gradient norm is {norm!r}"
        )


def check_buckets(
    buckets: Sequence[Sequence[tuple[str, torch.Tensor]]], bound: int, what: str
) -> None:
    """Every bucket within ``bound`` (or a lone larger tensor) and greedily packed in order."""
    sizes = [[t.numel() * t.element_size() for _, t in bucket] for bucket in buckets]
    for index, bucket_sizes in enumerate(sizes):
        if not bucket_sizes:
            raise AssertionError(f"{what}: bucket {index} is empty")
        if sum(bucket_sizes) > bound and len(bucket_sizes) > 1:
            raise AssertionError(
                f"{what}: bucket {index} holds {sum(bucket_sizes)} bytes in "
                f"{len(bucket_sizes)} tensors, above the bound of {bound}"
            )
    for index in range(len(sizes) - 1):
        if sum(sizes[index]) + sizes[index + 1][0] <= bound:
            first = buckets[index + 1][0][0]
            raise AssertionError(
                f"{what}: bucket {index} ({sum(sizes[index])} bytes) could also have taken "
                f"{first} ({sizes[index + 1][0]} bytes) within the bound of {bound}: not greedy"
            )
