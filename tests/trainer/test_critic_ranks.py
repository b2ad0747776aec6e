"""The critic's update on two gloo ranks, through the TrainBackend Protocol (FSDP2 and DeepSpeed
ZeRO-3), against a plain single-process PyTorch step on the whole batch."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from lrft.api.protocols import TrainBackend
from lrft.api.types import GenerationResult
from lrft.models.critic import load_critic
from lrft.testing.conformance._train_checks import OPTIMIZER, assert_close
from lrft.testing.distributed import DistributedSuite, RankPool, current_rank_context
from lrft.testing.models import save_tiny_causal_lm
from lrft.trainer.critic import CriticUpdate
from lrft.trainer.experience import ExperienceBatch
from lrft.trainer.replay import ReplayBuffer
from lrft.trainer.sequences import pack

ROWS = 8  # the global batch: 2 ranks x 2 micro-batches of 2 rows, one optimizer step
RESPONSE = 3
VALUE_CLIP = 0.05


def _backend(name: str) -> TrainBackend:
    if name == "fsdp2":
        from lrft.backends.train.fsdp2 import FSDP2Backend, FSDP2Config

        return FSDP2Backend(FSDP2Config(mixed_precision=False))
    from lrft.backends.train.deepspeed import DeepSpeedBackend, DeepSpeedConfig

    # fp32, and every parameter of the tiny model really sharded
    return DeepSpeedBackend(
        DeepSpeedConfig(zero_stage=3, mixed_precision=False, param_persistence_threshold=0)
    )


def _results() -> list[GenerationResult]:
    """Prompts of different lengths (so right padding matters) and responses of equal length (so
    the token mean of every micro-batch weighs each token as the whole batch's mean does)."""
    generator = torch.Generator().manual_seed(4)
    results = []
    for row in range(ROWS):
        ids = torch.randint(3, 256, (2 + row % 3 + RESPONSE,), generator=generator).tolist()
        results.append(
            GenerationResult(
                request_id=str(row),
                sample_index=0,
                prompt_token_ids=ids[:-RESPONSE],
                output_token_ids=ids[-RESPONSE:],
                finish_reason="length",
            )
        )
    return results


def _plain_values(model: torch.nn.Module, result: GenerationResult) -> torch.Tensor:
    ids = torch.tensor([list(result.prompt_token_ids) + list(result.output_token_ids)])
    p = len(result.prompt_token_ids)
    values: torch.Tensor = model(input_ids=ids).logits[0, p - 1 : p - 1 + RESPONSE, 0]
    return values


def _critic_step_matches_reference(root: Path, backend_name: str) -> tuple[float, float, float]:
    """One critic optimizer step through the backend on each rank's share, and the same step by
    a plain model on the whole batch; returns (max parameter diff, this rank's value loss, the
    reference's loss). Asserts the gradient norms agree and the clip was active."""
    context = current_rank_context()
    folder = root / "lm"
    if context.rank == 0 and not folder.exists():
        save_tiny_causal_lm(folder, seed=7)
    dist.barrier()
    critic = _backend(backend_name).prepare_trainable(
        load_critic(folder, seed=1), optimizer=OPTIMIZER
    )
    reference = load_critic(folder, seed=1)
    results = _results()
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        start = torch.stack([_plain_values(reference, r) for r in results])
    old_values = start + 0.1 * torch.randn(start.shape, generator=generator)
    returns = torch.randn(start.shape, generator=generator)

    sequences = pack(results)
    share = ROWS // context.world_size
    rows = torch.arange(context.rank * share, (context.rank + 1) * share)
    zeros = torch.zeros(ROWS, RESPONSE)
    buffer = ReplayBuffer(seed=0)
    buffer.append(
        ExperienceBatch(
            sequences=sequences,
            old_logprobs=zeros,
            ref_logprobs=None,
            scores=torch.zeros(ROWS),
            advantages=zeros,
            values=old_values,
            returns=returns,
        ).select(rows)
    )
    update = CriticUpdate(micro_batch_size=2, accumulation=2, epochs=1, value_clip=VALUE_CLIP)
    metrics = update.run(critic, buffer, step=0, device=context.device)

    # the reference: PPO2's clipped value loss written out, over every token of the batch
    optimizer = torch.optim.AdamW(
        reference.parameters(),
        lr=OPTIMIZER.lr,
        betas=OPTIMIZER.betas,
        eps=OPTIMIZER.eps,
        weight_decay=OPTIMIZER.weight_decay,
    )
    values = torch.stack([_plain_values(reference, r) for r in results])
    moved = old_values + torch.clamp(values - old_values, -VALUE_CLIP, VALUE_CLIP)
    unclipped, clipped = (values - returns) ** 2, (moved - returns) ** 2
    loss = 0.5 * torch.maximum(unclipped, clipped).mean()
    torch.autograd.backward(loss)
    norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), OPTIMIZER.max_grad_norm)
    optimizer.step()
    active = float((clipped > unclipped).float().mean())
    assert 0.0 < active < 1.0, f"the clip decided {active:.0%} of the tokens: a weak test"
    assert abs(metrics["critic/grad_norm"] - float(norm)) <= 1e-4 * float(norm), (metrics, norm)
    assert metrics["critic/skipped_steps"] == 0.0

    gathered = {
        name: tensor.detach().cpu().clone()
        for bucket in critic.full_weights(1 << 20)
        for name, tensor in bucket
    }
    expected = {name: p.detach() for name, p in reference.named_parameters()}
    worst = assert_close(gathered, expected, f"{backend_name} critic after one step")
    return worst, metrics["critic/value_loss"], float(loss)


BACKENDS = [
    "fsdp2",
    pytest.param(
        "deepspeed",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("deepspeed") is None,
            reason="deepspeed is not installed: pip install 'lrft[deepspeed]'",
        ),
    ),
]


class TestCriticUpdateWorld2(DistributedSuite):
    world_size = 2

    @pytest.mark.parametrize("backend", BACKENDS)
    def test_one_critic_step_matches_a_plain_single_process_step(
        self, pool: RankPool, tmp_path: Path, backend: str
    ) -> None:
        root = pool.shared_dir / tmp_path.name
        results = pool.run(_critic_step_matches_reference, root, backend)
        worst = max(diff for diff, _, _ in results)
        reference_loss = results[0][2]
        # each rank's loss is the mean over its half of the tokens: their mean is the batch's
        mean_loss = sum(loss for _, loss, _ in results) / len(results)
        assert mean_loss == pytest.approx(reference_loss, rel=1e-5)
        print(f"{backend} critic step at world 2: max abs parameter diff {worst:.2e}")
