"""The intercepted head under DeepSpeed ZeRO-3 (parameters gathered and released around each
module's forward): values, the global gradient norm and every full gradient equal those of the
plain full-logits path. Skipped where deepspeed is not installed."""

from __future__ import annotations

import pytest

pytest.importorskip("deepspeed", reason="deepspeed is not installed: pip install 'lrft[deepspeed]'")

from lrft.api.optim import OptimizerConfig
from lrft.testing.distributed import DistributedSuite, RankPool, current_rank_context
from lrft.testing.models import tiny_causal_lm
from lrft.trainer.logprobs import output_head, plain_response_logprobs, response_logprobs
from tests.unit.trainer.test_fused_logprobs import CPU, _sequences, _weights


def _zero3_gradients(tied: bool) -> tuple[float, float, float]:
    """Largest value difference, relative global-gradient-norm difference and largest relative
    difference of any full gradient, fused against plain, under ZeRO-3 with every parameter
    sharded (the head weight gathered and released around the head's forward)."""
    from deepspeed.utils import safe_get_full_grad

    from lrft.backends.train.deepspeed import DeepSpeedBackend, DeepSpeedConfig

    current_rank_context()
    outcome = {}
    for fused in (True, False):
        backend = DeepSpeedBackend(
            DeepSpeedConfig(zero_stage=3, mixed_precision=False, param_persistence_threshold=0)
        )
        actor = backend.prepare_trainable(
            tiny_causal_lm(0, tie_word_embeddings=tied), optimizer=OptimizerConfig(lr=1e-2)
        )
        assert output_head(actor.module) is not None  # the engine's model has a plain head
        sequences = _sequences()
        path = response_logprobs if fused else plain_response_logprobs
        values = path(actor.module, sequences, temperature=0.7, device=CPU)
        actor.backward((values * _weights(sequences)).sum())
        assert actor.engine is not None
        grads = {}
        for name, param in actor.engine.module.named_parameters():
            grad = safe_get_full_grad(param)  # collective under ZeRO-3
            assert grad is not None, name
            grads[name] = grad.clone()
        report = actor.step()
        outcome[fused] = (values.detach(), report.grad_norm, grads)
    values_gap = (outcome[True][0] - outcome[False][0]).abs().max().item()
    norm_gap = abs(outcome[True][1] - outcome[False][1]) / outcome[False][1]
    grads_gap = max(
        float((outcome[True][2][name] - reference).norm() / reference.norm().clamp(min=1e-30))
        for name, reference in outcome[False][2].items()
    )
    return values_gap, norm_gap, grads_gap


class TestFusedOnZero3World2(DistributedSuite):
    world_size = 2

    @pytest.mark.parametrize("tied", [False, True])
    def test_zero3_gradients_equal_the_plain_path(self, pool: RankPool, tied: bool) -> None:
        for values_gap, norm_gap, grads_gap in pool.run(_zero3_gradients, tied):
            assert values_gap < 1e-5
            assert norm_gap < 1e-5
            assert grads_gap < 1e-5
