"""Policy epochs: the configured policy loss (with KL loss and entropy bonus when set) over
shuffled micro-batches, accumulated."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import torch
from torch import Tensor

from lrft.algo import (
    PolicyLossConfig,
    PolicyLossInputs,
    aggregate_loss,
    aggregation_divisor,
    entropy_from_logits,
    high_entropy_token_mask,
    kl_loss,
    policy_losses,
)
from lrft.algo.types import AggregationMode
from lrft.api.protocols import TrainableModel
from lrft.config import TrainConfig
from lrft.trainer._update_loop import Metrics, step_groups
from lrft.trainer.experience import (
    ExperienceBatch,
    response_logits,
    response_logprobs,
    token_logprobs,
)
from lrft.trainer.micro_batches import PackedMicroBatch, packed_passes
from lrft.trainer.packing import PADDED, TokenLayout
from lrft.trainer.replay import ReplayBuffer


@attrs.frozen(kw_only=True)
class PolicyUpdate:
    """Settings of the policy phase.

    ``accumulation``: micro-batches per optimizer step (each micro-batch loss is divided by it).
    ``loss_name``: the registered policy loss (``lrft.algo.policy_losses``), run with ``loss``.
    ``first_token_temperature``: FIRE's, at which each response's first token was sampled and
    is scored. ``entropy_coef``: ``None`` computes no entropy, 0 only logs it, above 0 adds
    ``- entropy_coef * entropy`` (aggregated like the loss) to the loss. ``high_entropy_ratio``:
    above 0 the policy loss sees only that top fraction of each micro-batch's tokens by entropy.
    ``max_tokens_per_micro_batch``: when set, each optimizer step's rows are packed into forwards
    of at most that many (padded) tokens (:mod:`lrft.trainer.micro_batches`); the loss is still
    aggregated over the fixed micro-batches of ``micro_batch_size`` rows, so the gradient does not
    change. ``layout``: how each forward lays its rows out (padded, or packed end to end and
    then ``max_tokens_per_micro_batch`` counts real tokens: :mod:`lrft.trainer.packing`).
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
    first_token_temperature: float | None = None
    entropy_coef: float | None = None
    high_entropy_ratio: float = 0.0
    max_tokens_per_micro_batch: int | None = None
    layout: TokenLayout = PADDED

    def __attrs_post_init__(self) -> None:
        if self.max_tokens_per_micro_batch is not None and self.high_entropy_ratio > 0:
            raise ValueError(
                "high_entropy_ratio selects tokens within each micro-batch, so it cannot be "
                "combined with max_tokens_per_micro_batch, which repacks the micro-batches"
            )

    @classmethod
    def from_config(
        cls, config: TrainConfig, *, world_size: int, layout: TokenLayout = PADDED
    ) -> PolicyUpdate:
        """The policy phase that ``config`` describes on ``world_size`` ranks, whose forwards
        lay their rows out as ``layout`` does (a sequence-parallel group's ranks share one
        part of the batch)."""
        per_rank = config.train_batch_size // (world_size // layout.group_size)
        return cls(
            micro_batch_size=config.micro_train_batch_size,
            accumulation=per_rank // config.micro_train_batch_size,
            epochs=config.max_epochs,
            temperature=config.temperature,
            loss=config.policy_loss_config(),
            loss_name=config.policy_loss_type,
            kl_coef=config.init_kl_coef,
            kl_estimator=config.kl_estimator,
            use_kl_loss=config.use_kl_loss,
            first_token_temperature=config.first_token_temperature,
            entropy_coef=config.entropy_loss_coef,
            high_entropy_ratio=config.high_entropy_token_ratio,
            max_tokens_per_micro_batch=config.max_tokens_per_micro_batch,
            layout=layout,
        )

    @property
    def needs_entropy(self) -> bool:
        return self.entropy_coef is not None or self.high_entropy_ratio > 0

    def micro_batch_loss(
        self, module: torch.nn.Module, batch: ExperienceBatch, device: torch.device
    ) -> tuple[Tensor, dict[str, float]]:
        """One micro-batch's loss (before the division by ``accumulation``) and its metrics.

        The forward may be collective (FSDP all-gathers): every rank calls it equally often.
        """
        logprobs, entropy = self.forward(module, batch, device)
        return self.loss_of(batch, logprobs, entropy, device)

    def forward(
        self, module: torch.nn.Module, batch: ExperienceBatch, device: torch.device
    ) -> tuple[Tensor, Tensor | None]:
        """(B, T) logprobs of ``batch``'s responses, and their entropy when it is needed.

        The forward may be collective (FSDP all-gathers): every rank calls it equally often.
        """
        mask = batch.sequences.action_mask.to(device)
        entropy = None
        if self.needs_entropy:
            # The entropy needs the whole distribution, so this path keeps full-vocabulary logits.
            logits = response_logits(
                module,
                batch.sequences,
                temperature=self.temperature,
                device=device,
                first_token_temperature=self.first_token_temperature,
                layout=self.layout,
            )
            logprobs = token_logprobs(logits, batch.sequences)
            entropy = entropy_from_logits(logits, mask)
        else:
            logprobs = response_logprobs(
                module,
                batch.sequences,
                temperature=self.temperature,
                device=device,
                first_token_temperature=self.first_token_temperature,
                layout=self.layout,
            )
        return logprobs, entropy

    def loss_of(
        self,
        batch: ExperienceBatch,
        logprobs: Tensor,
        entropy: Tensor | None,
        device: torch.device,
        *,
        group_mask: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, float]]:
        """The loss of ``batch`` from its forward's ``logprobs`` (and ``entropy``), and metrics.

        ``group_mask``: the action mask of the whole fixed micro-batch these rows belong to,
        when they are only part of it; each term is then scaled by these rows' share of the
        count it is aggregated over, so that the parts' losses add up to the micro-batch's.
        """
        mask = batch.sequences.action_mask.to(device)

        def share(mode: AggregationMode) -> Tensor | float:
            if group_mask is None:
                return 1.0
            whole = aggregation_divisor(group_mask, mode).clamp(min=1)
            return aggregation_divisor(mask, mode) / whole

        loss_mask = mask
        if entropy is not None and self.high_entropy_ratio > 0:
            loss_mask = high_entropy_token_mask(entropy, mask, self.high_entropy_ratio)
        engine = None
        if self.loss.tis_cap is not None and batch.engine_logprobs is not None:
            engine = batch.engine_logprobs.to(device)
        output = policy_losses.get(self.loss_name).fn(
            PolicyLossInputs(
                logprobs=logprobs,
                # on-policy experience (no old logprobs): the ratio is exactly 1 at this forward
                old_logprobs=(
                    logprobs.detach()
                    if batch.old_logprobs is None
                    else batch.old_logprobs.to(device)
                ),
                advantages=batch.advantages.to(device),
                action_mask=loss_mask,
                engine_logprobs=engine,
            ),
            self.loss,
        )
        # A sequence-level loss averages over responses, as the seq-mean aggregations do.
        policy_mode: AggregationMode = (
            "seq-mean-token-mean"
            if policy_losses.get(self.loss_name).sequence_level
            else self.loss.token_aggregation
        )
        loss = output.loss * share(policy_mode)
        values = output.metrics.as_floats()
        values["policy_loss"] = float(output.loss.detach())
        if entropy is not None:
            bonus = aggregate_loss(
                entropy, mask, self.loss.token_aggregation, max_len=self.loss.max_len
            )
            values["entropy"] = float(bonus.detach())
            if self.entropy_coef:
                loss = loss - self.entropy_coef * bonus * share(self.loss.token_aggregation)
        if self.use_kl_loss and batch.ref_logprobs is not None:
            kl = kl_loss(logprobs, batch.ref_logprobs.to(device), mask, estimator=self.kl_estimator)
            loss = loss + self.kl_coef * kl * share("token-mean")
            values["kl_loss"] = float(kl.detach())
        return loss, values

    def run(
        self, actor: TrainableModel, buffer: ReplayBuffer, *, step: int, device: torch.device
    ) -> dict[str, float]:
        """Every epoch over ``buffer``; returns averaged metrics. Collective (forwards, steps)."""
        metrics = Metrics()
        actor.module.train()
        for groups in step_groups(
            buffer,
            micro_batch_size=self.micro_batch_size,
            accumulation=self.accumulation,
            epochs=self.epochs,
            step=step,
            what="policy",
        ):
            # Every backward but the step's last may leave its gradients unreduced.
            if self.max_tokens_per_micro_batch is None:
                for index, rows in enumerate(groups):
                    loss, values = self.micro_batch_loss(actor.module, buffer.select(rows), device)
                    last = index == len(groups) - 1
                    actor.backward(loss / self.accumulation, sync_gradients=last)
                    metrics.record(values)
            else:
                passes = packed_passes(
                    groups,
                    buffer.row_lengths(),
                    self.max_tokens_per_micro_batch,
                    device,
                    packed=self.layout.packed,
                )
                for index, micro in enumerate(passes):
                    last = index == len(passes) - 1
                    self._packed_backward(
                        actor, buffer, groups, micro, device, metrics.record, last=last
                    )
            metrics.record_step(actor.step())
        actor.module.eval()
        return metrics.averages("policy")

    def _packed_backward(
        self,
        actor: TrainableModel,
        buffer: ReplayBuffer,
        groups: list[Tensor],
        micro: PackedMicroBatch,
        device: torch.device,
        record: Callable[[dict[str, float]], None],
        *,
        last: bool,
    ) -> None:
        """One forward over a packed micro-batch, then the loss of each fixed micro-batch's
        rows in it (scaled by their share), back-propagated together (``last``: the step's last
        pass, which reduces the gradients)."""
        batch = buffer.select(micro.buffer_rows)
        logprobs, entropy = self.forward(actor.module, batch, device)
        losses = []
        for part in micro.parts:
            rows = torch.tensor(part.rows)
            piece = batch.select(rows)
            steps = piece.sequences.action_mask.shape[1]
            whole = buffer.select(groups[part.group]).sequences.action_mask.to(device)
            loss, values = self.loss_of(
                piece,
                logprobs[rows.to(device), :steps],
                None if entropy is None else entropy[rows.to(device), :steps],
                device,
                group_mask=whole,
            )
            losses.append(loss)
            record(values)
        # A padding micro-batch (no parts) still back-propagates, as a collective, to no effect.
        total = torch.stack(losses).sum() if losses else logprobs.sum() * 0.0
        actor.backward(total / self.accumulation, sync_gradients=last)


def needs_old_logprob_pass(config: TrainConfig, actor: torch.nn.Module) -> bool:
    """Whether the behaviour-policy logprobs need a forward pass of their own.

    They do not when one epoch makes one optimizer step per iteration: every micro-batch's
    forward then runs on the parameters the separate pass would have used, so its logprobs,
    detached, are the old ones (the ratio is exactly 1 at that forward). The pass is still made
    when something reads the old logprobs before or outside the update (the KL against a
    reference model, a distillation teacher, saved trajectories), or when dropout would make the training forward
    differ from the evaluation-mode pass.
    """
    on_policy = (
        config.max_epochs == 1
        and config.train_batch_size == config.samples_per_rollout
        and config.init_kl_coef == 0.0
        and not config.save_trajectories
        # the distillation advantage reads the student's logprobs before the update
        and not config.uses_teacher
    )
    return not on_policy or _has_dropout(actor)


def _has_dropout(module: torch.nn.Module) -> bool:
    if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in module.modules()):
        return True
    # attention dropout is applied functionally, from the config (transformers models)
    settings = getattr(getattr(module, "config", None), "__dict__", {})
    return any(
        "dropout" in name and isinstance(value, int | float) and value > 0
        for name, value in settings.items()
    )
