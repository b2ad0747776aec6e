"""Policy epochs: clipped policy loss (and KL loss) over shuffled micro-batches, accumulated."""

from __future__ import annotations

import attrs
import torch

from lrft.algo import PolicyLossConfig, PolicyLossInputs, kl_loss, policy_losses
from lrft.api.protocols import TrainableModel
from lrft.trainer.experience import response_logprobs
from lrft.trainer.replay import ReplayBuffer


@attrs.frozen(kw_only=True)
class PolicyUpdate:
    """Settings of the policy phase.

    ``accumulation``: micro-batches per optimizer step (each micro-batch loss is divided by it).
    """

    micro_batch_size: int
    accumulation: int
    epochs: int
    temperature: float
    loss: PolicyLossConfig = attrs.field(factory=PolicyLossConfig)
    loss_name: str = "ppo"
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    use_kl_loss: bool = False

    def run(
        self, actor: TrainableModel, buffer: ReplayBuffer, *, step: int, device: torch.device
    ) -> dict[str, float]:
        """Every epoch over ``buffer``; returns averaged metrics. Collective (forwards, steps)."""
        loss_fn = policy_losses.get(self.loss_name).fn
        totals: dict[str, float] = {}
        counts: dict[str, int] = {}
        pending = 0
        actor.module.train()
        for epoch in range(self.epochs):
            for batch in buffer.micro_batches(self.micro_batch_size, epoch=step * 1000 + epoch):
                logprobs = response_logprobs(
                    actor.module, batch.sequences, temperature=self.temperature, device=device
                )
                mask = batch.sequences.action_mask.to(device)
                output = loss_fn(
                    PolicyLossInputs(
                        logprobs=logprobs,
                        old_logprobs=batch.old_logprobs.to(device),
                        advantages=batch.advantages.to(device),
                        action_mask=mask,
                    ),
                    self.loss,
                )
                loss = output.loss
                values = output.metrics.as_floats()
                values["policy_loss"] = float(output.loss.detach())
                if self.use_kl_loss and batch.ref_logprobs is not None:
                    kl = kl_loss(
                        logprobs, batch.ref_logprobs.to(device), mask, estimator=self.kl_estimator
                    )
                    loss = loss + self.kl_coef * kl
                    values["kl_loss"] = float(kl.detach())
                actor.backward(loss / self.accumulation)
                pending += 1
                if pending == self.accumulation:
                    report = actor.step()
                    values["grad_norm"] = report.grad_norm
                    values["skipped_steps"] = float(report.skipped)
                    values["lr"] = report.lr
                    pending = 0
                for name, value in values.items():
                    totals[name] = totals.get(name, 0.0) + value
                    counts[name] = counts.get(name, 0) + 1
        if pending:
            raise RuntimeError(
                f"{pending} micro-batches were left without an optimizer step: the buffer size "
                "must be a multiple of micro_batch_size * accumulation"
            )
        actor.module.eval()
        return {f"policy/{name}": total / counts[name] for name, total in totals.items()}
