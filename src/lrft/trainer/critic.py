"""The PPO critic: a causal-LM backbone with a scalar value head, its values and its update.

The critic is a plain transformers token-classification model with one label
(``AutoModelForTokenClassification``: the backbone under ``model.``, a ``Linear(hidden, 1)`` head
named ``score``), so any ``TrainBackend`` wraps, shards, offloads and checkpoints it exactly as it
does the actor, and its state dict is a Hugging Face one. It starts from a causal LM folder
(the backbone's weights; the head is new) or from a saved critic (both).

Values are response-aligned like logprobs: ``values[i, t]`` is the critic's estimate of the state
*before* response token ``t`` (everything up to position ``prompt_length + t - 1``), the state in
which the policy chose that token.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import torch
from torch import Tensor

from lrft.algo import clipped_value_loss
from lrft.algo._tensor import masked_mean
from lrft.api.protocols import FrozenModel, TrainableModel
from lrft.trainer._update_loop import Metrics, step_groups
from lrft.trainer.micro_batches import PackedMicroBatch, PackedPart, packed_passes
from lrft.trainer.packing import PADDED, TokenLayout
from lrft.trainer.passes import gradient_free
from lrft.trainer.replay import ReplayBuffer
from lrft.trainer.sequences import Sequences, fsdp2_view_outputs_safe


def response_values(
    module: torch.nn.Module,
    sequences: Sequences,
    *,
    device: torch.device,
    layout: TokenLayout = PADDED,
) -> Tensor:
    """(B, T) float values of the states before each generated token; 0 where masked.
    ``layout``: padded or packed rows (:mod:`lrft.trainer.packing`).

    Differentiable when grad is enabled. The forward may be collective (FSDP all-gathers, a
    sequence-parallel group's exchanges): every rank calls it equally often.
    """
    laid = layout.lay_out(module, sequences, device)
    inputs = laid.inputs
    if not layout.packed and not sequences.media:
        # a text row needs no more than ids and mask (as the critic's pretraining saw it)
        inputs = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}
    # The token-classification head returns its Linear's output, a view, which FSDP2 warns of;
    # nothing here writes to it in place (the pick and masked_fill below make new tensors).
    with fsdp2_view_outputs_safe():
        scores: Tensor = module(**inputs).logits[..., 0]
    values = laid.pick(scores, laid.response_index(sequences)).float()
    return values.masked_fill(~sequences.action_mask.to(device), 0.0)


def critic_values(
    critic: FrozenModel,
    sequences: Sequences,
    *,
    micro_batch_size: int,
    device: torch.device,
    layout: TokenLayout = PADDED,
    max_tokens: int | None = None,
) -> Tensor:
    """Gradient-free :func:`response_values` of ``critic``, forward by forward
    (:func:`lrft.trainer.passes.gradient_free`), on the CPU. Collective."""
    return gradient_free(
        sequences,
        lambda chunk: response_values(critic.module, chunk, device=device, layout=layout),
        micro_batch_size=micro_batch_size,
        layout=layout,
        max_tokens=max_tokens,
        device=device,
    )


@attrs.frozen(kw_only=True)
class CriticUpdate:
    """The critic's epochs: clipped value loss over the same shuffled micro-batches as the policy.

    The buffer hands out the same micro-batches in the same order as it does to the policy phase
    (its shuffle depends on the step and epoch only), and the critic steps its optimizer after
    ``accumulation`` of them: one critic optimizer step per policy optimizer step.
    ``value_clip``: PPO's clip of the new values around the experience pass's (``None``: off).
    ``max_tokens_per_micro_batch``: pack each optimizer step's rows into forwards of at most that
    many padded tokens, as the policy update does (:mod:`lrft.trainer.micro_batches`); each
    fixed micro-batch's token-mean loss is then the sum of its parts, each scaled by its share of
    the micro-batch's tokens, so the step is the fixed path's.
    """

    micro_batch_size: int
    accumulation: int
    epochs: int
    value_clip: float | None
    max_tokens_per_micro_batch: int | None = None
    layout: TokenLayout = PADDED
    """How each forward lays its rows out (:mod:`lrft.trainer.packing`)."""

    def run(
        self, critic: TrainableModel, buffer: ReplayBuffer, *, step: int, device: torch.device
    ) -> dict[str, float]:
        """Every epoch over ``buffer``; returns averaged ``critic/*`` metrics. Collective."""
        metrics = Metrics()
        critic.module.train()
        for groups in step_groups(
            buffer,
            micro_batch_size=self.micro_batch_size,
            accumulation=self.accumulation,
            epochs=self.epochs,
            step=step,
            what="critic",
        ):
            passes = self._passes(groups, buffer, device)
            tokens = [buffer.select(rows).sequences.action_mask.sum() for rows in groups]
            for index, micro in enumerate(passes):
                # every backward but the step's last may leave its gradients unreduced
                last = index == len(passes) - 1
                self._backward(critic, buffer, micro, tokens, device, metrics.record, last=last)
            metrics.record_step(critic.step())
        critic.module.eval()
        return metrics.averages("critic")

    def _passes(
        self, groups: list[Tensor], buffer: ReplayBuffer, device: torch.device
    ) -> list[PackedMicroBatch]:
        """The forwards of one optimizer step: one per fixed micro-batch, or packed by tokens."""
        if self.max_tokens_per_micro_batch is None:
            return [
                PackedMicroBatch(
                    buffer_rows=rows,
                    parts=(PackedPart(group=group, rows=tuple(range(len(rows)))),),
                )
                for group, rows in enumerate(groups)
            ]
        return packed_passes(
            groups,
            buffer.row_lengths(),
            self.max_tokens_per_micro_batch,
            device,
            packed=self.layout.packed,
        )

    def _backward(
        self,
        critic: TrainableModel,
        buffer: ReplayBuffer,
        micro: PackedMicroBatch,
        group_tokens: list[Tensor],
        device: torch.device,
        record: Callable[[dict[str, float]], None],
        *,
        last: bool,
    ) -> None:
        """One forward, then each fixed micro-batch's part of the loss (its token-mean scaled by
        the part's share of that micro-batch's tokens), back-propagated together."""
        batch = buffer.select(micro.buffer_rows)
        if batch.values is None or batch.returns is None:
            raise ValueError("the critic update needs experience with values and returns")
        values = response_values(critic.module, batch.sequences, device=device, layout=self.layout)
        old_values, returns = batch.values.to(device), batch.returns.to(device)
        masks = batch.sequences.action_mask.to(device)
        losses = []
        for part in micro.parts:
            # columns past a part's longest response are masked out: no need to trim them
            rows = torch.tensor(part.rows, device=device)
            mask, mine = masks[rows], values[rows]
            output = clipped_value_loss(
                mine, old_values[rows], returns[rows], mask, value_clip=self.value_clip
            )
            share = mask.sum() / group_tokens[part.group].to(device)
            losses.append(output.loss * share)
            record(
                {
                    "value_loss": float(output.loss.detach()),
                    "value_clip_fraction": float(output.clip_fraction),
                    "values": float(masked_mean(mine.detach(), mask)),
                }
            )
        # A padding forward (no parts) still back-propagates, as a collective, to no effect.
        total = torch.stack(losses).sum() if losses else values.sum() * 0.0
        critic.backward(total / self.accumulation, sync_gradients=last)
