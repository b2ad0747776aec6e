"""Packing and sequence parallelism in the trainer, on two gloo ranks: an iteration packed trains
as the padded one does; with the two ranks as one sequence-parallel group, its passes equal the
unsplit ones, its iteration trains as the unsplit run's, and Qwen2-VL rows with images split
over it score and back-propagate as unsplit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lrft.dist.sequence_parallel import SequenceParallelLayout
from lrft.models.packed_attention import PACKED_ATTENTION, use_packed_attention
from lrft.testing.conformance._rollout_media_checks import media_prompts
from lrft.testing.distributed import DistributedSuite, RankPool, current_rank_context
from lrft.testing.reference import load_reference_vlm
from lrft.testing.vision_models import save_tiny_vlm
from lrft.trainer.critic import critic_values
from lrft.trainer.experience import response_logprobs
from lrft.trainer.packing import TokenLayout
from lrft.trainer.sequences import pack
from tests.trainer.test_trainer_ranks import _trainer
from tests.unit.trainer.test_packing import image_results

CPU = torch.device("cpu")
GAE = ["--advantage_estimator=gae", "--init_kl_coef=0.05"]
PACKING = ["--packing_samples"]
SPLIT = ["--packing_samples", "--sequence_parallel_size=2"]
# one optimizer step over all 16 samples, and a loss that is a mean over samples: the step does
# not depend on which samples share a micro-batch (a sequence-parallel group's rows are its
# ranks' together)
ONE_STEP = ["--train_batch_size=16", "--loss_agg_mode=seq-mean-token-mean"]


def _weights_after_a_step(root: Path, extra: list[str]) -> dict[str, torch.Tensor]:
    trainer = _trainer(root, extra)
    config: Any = trainer.actor.module.config
    attention = config._attn_implementation
    assert (attention == PACKED_ATTENTION) == ("--packing_samples" in extra), attention
    trainer.colocation.sync(version=0)
    metrics = trainer.train_step()
    assert all(value == value for value in metrics.values()), metrics  # no NaN
    models = [("actor", trainer.actor)] + (
        [] if trainer.critic is None else [("critic", trainer.critic)]
    )
    return {
        f"{role}/{name}": tensor.clone()
        for role, model in models
        for bucket in model.full_weights(1 << 20)
        for name, tensor in bucket
    }


def _assert_same_weights(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert got.keys() == expected.keys()
    for name, weight in expected.items():
        torch.testing.assert_close(got[name], weight, rtol=1e-5, atol=1e-6, msg=name)


def _split_passes_equal_unsplit(root: Path) -> list[float]:
    """The group's old-logprob and value passes against the same passes unsplit, on this rank's
    own rows; and the replay buffer holding the group's rows on both ranks."""
    trainer = _trainer(root, [*SPLIT, *GAE])
    maker, critic = trainer.maker, trainer.critic
    assert critic is not None
    assert maker.layout.group is not None
    trainer.colocation.sync(version=0)
    sequences = trainer.rollout.collect(0).sequences
    unsplit = TokenLayout(packed=True)
    split_logprobs = maker.logprobs(trainer.actor, sequences)
    split_values = critic_values(
        critic, sequences, micro_batch_size=2, device=trainer.device, layout=maker.layout
    )
    maker.layout = unsplit
    logprobs = maker.logprobs(trainer.actor, sequences)
    values = critic_values(
        critic, sequences, micro_batch_size=2, device=trainer.device, layout=unsplit
    )
    assert split_logprobs.shape == logprobs.shape == sequences.action_mask.shape
    assert bool((split_logprobs[sequences.action_mask] < 0).all())
    return [
        float((split_logprobs - logprobs).abs().max()),
        float((split_values - values).abs().max()),
    ]


def _image_rows_split_equal_unsplit(root: Path) -> list[float]:
    """Qwen2-VL rows with images, packed and split over the two ranks (each merges the images
    into the whole row, then keeps its share), against the same rows packed unsplit: logprobs,
    and the gradients summed over the group (each rank's are its own tokens')."""
    if current_rank_context().rank == 0 and not (root / "vlm").exists():
        save_tiny_vlm(root / "vlm")
    dist.barrier()
    prompts = media_prompts(root / "vlm", rank=0)
    results = image_results(prompts, seed=4)
    sequences = pack(results, media=[p.processed for p in prompts])
    group = SequenceParallelLayout(world_size=2, sp_size=2).build_group()
    outputs = []
    for layout in (TokenLayout(packed=True), TokenLayout(packed=True, group=group)):
        model = load_reference_vlm(root / "vlm")
        use_packed_attention(model)
        logprobs = response_logprobs(model, sequences, temperature=1.0, device=CPU, layout=layout)
        weights = torch.linspace(-1.0, 1.0, logprobs.numel()).reshape(logprobs.shape)
        torch.autograd.backward((logprobs * weights).sum())
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        dist.all_reduce(grads)  # the ranks' mean, as a train backend averages them
        outputs.append((logprobs.detach(), grads / 2))
    (unsplit, unsplit_grads), (split, split_grads) = outputs
    return [
        float((split - unsplit).abs().max()),
        float((split_grads - unsplit_grads).abs().max()),
    ]


class TestLongSequenceRanks(DistributedSuite):
    world_size = 2

    def test_packed_iteration_trains_actor_and_critic_as_the_padded_one(
        self, pool: RankPool, tmp_path: Path
    ) -> None:
        root = pool.shared_dir / tmp_path.name
        padded = pool.run(_weights_after_a_step, root, GAE)[0]
        packed = pool.run(_weights_after_a_step, root, [*GAE, *PACKING])[0]
        _assert_same_weights(packed, padded)

    def test_a_sequence_parallel_group_passes_and_trains_as_the_unsplit_run(
        self, pool: RankPool, tmp_path: Path
    ) -> None:
        root = pool.shared_dir / tmp_path.name
        for diffs in pool.run(_split_passes_equal_unsplit, root):
            assert max(diffs) <= 1e-5, diffs
        unsplit = pool.run(_weights_after_a_step, root, [*PACKING, *ONE_STEP])
        split = pool.run(_weights_after_a_step, root, [*SPLIT, *ONE_STEP])
        _assert_same_weights(split[0], unsplit[0])
        _assert_same_weights(split[1], split[0])  # the group's ranks hold one model

    def test_image_rows_split_over_a_group_equal_unsplit(
        self, pool: RankPool, tmp_path: Path
    ) -> None:
        for value_diff, grad_diff in pool.run(
            _image_rows_split_equal_unsplit, pool.shared_dir / tmp_path.name
        ):
            assert value_diff <= 1e-5
            assert grad_diff <= 1e-4
