"""``FSDP2Config.reshard_after_forward=False`` keeps each decoder layer's gathered weights from its
forward to its backward (visible as plain tensors in place of DTensor shards), and trains exactly
as the default does: same gradients, same weights after an optimizer step.

``FSDP2Config.defer_gradient_sync=True`` honours ``backward(sync_gradients=False)``: the weights
stay gathered and ``step`` refuses unreduced gradients (the conformance suite's accumulation test
checks that the deferred step equals one batch)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import torch
from torch.distributed.tensor import DTensor

from lrft.api.optim import OptimizerConfig
from lrft.testing.distributed import DistributedSuite, RankPool, current_rank_context
from lrft.testing.models import random_token_batch, tiny_causal_lm

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from lrft.backends.train._fsdp2_models import FSDP2TrainableModel
    from lrft.backends.train.fsdp2 import FSDP2Config


def _prepared_tiny(
    config: FSDP2Config,
) -> tuple[PreTrainedModel, FSDP2TrainableModel, torch.Tensor]:
    """A tiny causal LM prepared by FSDP2 with ``config``, and a loss of one forward on this
    rank's tokens."""
    from lrft.backends.train.fsdp2 import FSDP2Backend

    context = current_rank_context()
    model = tiny_causal_lm(seed=3)
    model.train()
    trainable = FSDP2Backend(config).prepare_trainable(model, optimizer=OptimizerConfig(lr=1e-2))
    tokens = random_token_batch(seed=context.rank, batch=2, length=12)
    loss = trainable.module(input_ids=tokens).logits.float().square().mean()
    return model, trainable, loss


def _layer_weights_after_forward_and_step(reshard: bool) -> tuple[bool, dict[str, torch.Tensor]]:
    from lrft.backends.train.fsdp2 import FSDP2Config

    model, trainable, loss = _prepared_tiny(
        FSDP2Config(mixed_precision=False, reshard_after_forward=reshard)
    )
    q_proj = model.model.layers[0].self_attn.q_proj.weight
    gathered_between = not isinstance(q_proj, DTensor)
    trainable.backward(loss)
    trainable.step()
    weights = {
        name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
        for name, p in trainable.module.named_parameters()
    }
    return gathered_between, weights


class TestReshardAfterForwardWorld2(DistributedSuite):
    world_size = 2

    @pytest.mark.parametrize("reshard", [True, False])
    def test_layer_weights_between_forward_and_backward(
        self, pool: RankPool, reshard: bool
    ) -> None:
        for gathered, _ in pool.run(_layer_weights_after_forward_and_step, reshard):
            assert gathered is (not reshard)

    def test_training_is_the_same_either_way(self, pool: RankPool) -> None:
        default = pool.run(_layer_weights_after_forward_and_step, True)[0][1]
        kept = pool.run(_layer_weights_after_forward_and_step, False)[0][1]
        untrained = dict(tiny_causal_lm(seed=3).named_parameters())
        assert default.keys() == kept.keys()
        for name, weight in default.items():
            assert not torch.equal(weight, untrained[name].detach()), name  # the step moved it
            torch.testing.assert_close(kept[name], weight, rtol=0, atol=0, msg=name)


def _after_a_deferred_backward(defer: bool) -> tuple[bool, str]:
    """Whether layer 0's weight is still gathered after ``backward(sync_gradients=False)``, and
    what ``step`` then says."""
    from lrft.backends.train.fsdp2 import FSDP2Config

    model, trainable, loss = _prepared_tiny(
        FSDP2Config(mixed_precision=False, defer_gradient_sync=defer)
    )
    trainable.backward(loss, sync_gradients=False)
    gathered = not isinstance(model.model.layers[0].self_attn.q_proj.weight, DTensor)
    try:
        trainable.step()
    except RuntimeError as error:
        return gathered, str(error)
    return gathered, "stepped"


class TestDeferredGradientSyncWorld2(DistributedSuite):
    world_size = 2

    def test_deferred_backward_keeps_gathered_weights_and_blocks_the_step(
        self, pool: RankPool
    ) -> None:
        for gathered, outcome in pool.run(_after_a_deferred_backward, True):
            assert gathered
            assert "after backward(sync_gradients=False)" in outcome

    def test_without_the_setting_the_hint_is_ignored(self, pool: RankPool) -> None:
        for gathered, outcome in pool.run(_after_a_deferred_backward, False):
            assert not gathered
            assert outcome == "stepped"


def test_deferred_sync_and_cpu_offload_are_refused_together() -> None:
    from lrft.backends.train.fsdp2 import FSDP2Config

    with pytest.raises(ValueError, match=r"defer_gradient_sync=True .* cpu_offload=True"):
        FSDP2Config(defer_gradient_sync=True, cpu_offload=True)
