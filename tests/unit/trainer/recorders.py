"""A ``TrainableModel`` stand-in for tests of the policy and critic updates."""

from __future__ import annotations

import torch
from torch import Tensor

from lrft.api.types import StepReport


class GradientRecorder:
    """Records each optimizer step's gradients and zeroes them instead of stepping (the
    gradients are what two update paths must agree on), and whether each backward asked to
    reduce the gradients."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.steps: list[list[Tensor]] = []
        self.syncs: list[list[bool]] = [[]]  # per step, each backward's sync_gradients

    def backward(self, loss: Tensor, *, sync_gradients: bool = True) -> None:
        torch.autograd.backward(loss)
        self.syncs[-1].append(sync_gradients)

    def step(self) -> StepReport:
        self.syncs.append([])
        self.steps.append(
            [
                torch.zeros_like(p) if p.grad is None else p.grad.clone()
                for p in self.module.parameters()
            ]
        )
        self.module.zero_grad(set_to_none=True)
        return StepReport(optimizer_steps=len(self.steps), grad_norm=0.0, skipped=False, lr=0.0)

    def check_only_last_backward_syncs(self) -> None:
        """Every optimizer step's backwards deferred the reduction except the last."""
        for syncs in self.syncs[:-1]:
            assert syncs == [False] * (len(syncs) - 1) + [True], syncs
        assert self.syncs[-1] == [], "backwards after the last step"
