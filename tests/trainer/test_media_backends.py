"""A tiny Qwen2-VL under each training backend (FSDP2, DeepSpeed ZeRO-3 with every parameter
sharded), on 1 and 2 gloo ranks: the actor's and the reference's response logprobs over rows
with 0, 1 and 2 images equal a plain transformers forward of each unpadded sequence (the
independent reference: :func:`lrft.testing.reference.media_token_logprobs`, which lets
transformers place the tokens itself), and one optimizer step with the vision tower frozen
leaves every tower weight bit-identical while the projector and the language model move. Ranks
whose micro-batches hold images on one rank and none on the other compute the reference's
logprobs and step with the plain model's gradient: the rank without images runs the tower over an
idle image (without it the sharded tower's collectives mismatch)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from lrft.api import GenerationResult
from lrft.api.optim import OptimizerConfig
from lrft.api.protocols import TrainableModel, TrainBackend
from lrft.models.media import (
    freeze_vision_tower,
    keep_vision_tower_running,
    load_generative_model,
)
from lrft.testing.conformance._rollout_media_checks import MediaPrompt, media_prompts
from lrft.testing.distributed import DistributedSuite, RankPool, current_rank_context
from lrft.testing.reference import load_reference_vlm, media_token_logprobs, token_logprobs
from lrft.testing.vision_models import save_tiny_vlm
from lrft.trainer.logprobs import response_logprobs
from lrft.trainer.sequences import Sequences, pack

CPU = torch.device("cpu")
DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
BACKENDS = [
    "fsdp2",
    pytest.param(
        "zero3", marks=pytest.mark.skipif(not DEEPSPEED, reason="deepspeed is not installed")
    ),
]
# Response tokens: ordinary byte tokens (never a media placeholder), different per row.
_RESPONSES = ((65, 66, 67), (70,), (48, 49, 50, 51), (120, 121))


def _backend(name: str) -> TrainBackend:
    if name == "fsdp2":
        from lrft.backends.train.fsdp2 import FSDP2Backend

        return FSDP2Backend()
    from lrft.backends.train.deepspeed import DeepSpeedBackend, DeepSpeedConfig

    # threshold 0: even this tiny model's parameters are really partitioned
    return DeepSpeedBackend(
        DeepSpeedConfig(zero_stage=3, mixed_precision=False, param_persistence_threshold=0)
    )


def _rows(model_dir: Path) -> tuple[list[MediaPrompt], Sequences]:
    prompts = media_prompts(model_dir, rank=0)  # 1, 0, 2 and 1 images
    results = [
        GenerationResult(
            request_id=p.request.request_id,
            sample_index=0,
            prompt_token_ids=p.request.prompt_token_ids,
            output_token_ids=tokens,
            finish_reason="length",
        )
        for p, tokens in zip(prompts, _RESPONSES, strict=True)
    ]
    return prompts, pack(results, media=[p.processed for p in prompts])


def _reference(model_dir: Path, prompts: list[MediaPrompt]) -> list[list[float]]:
    model = load_reference_vlm(model_dir)
    wanted = []
    for prompt, tokens in zip(prompts, _RESPONSES, strict=True):
        if prompt.processed is None:
            wanted.append(token_logprobs(model, prompt.request.prompt_token_ids, tokens))
        else:
            wanted.append(media_token_logprobs(model, prompt.processed, tokens))
    return wanted


def _prepare(root: Path) -> Path:
    context = current_rank_context()
    model_dir = root / "model"
    if context.rank == 0 and not model_dir.exists():
        save_tiny_vlm(model_dir)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
    return model_dir


def _logprob_gaps(root: Path, backend_name: str) -> tuple[float, float, bool]:
    """Largest difference to the reference of the actor's and of the reference model's response
    logprobs, and whether padding positions hold exactly 0."""
    model_dir = _prepare(root)
    prompts, sequences = _rows(model_dir)
    wanted = _reference(model_dir, prompts)
    backend = _backend(backend_name)
    actor = backend.prepare_trainable(
        load_generative_model(model_dir, dtype=torch.float32), optimizer=OptimizerConfig(lr=1e-3)
    )
    frozen = backend.prepare_frozen(load_generative_model(model_dir, dtype=torch.float32))
    torch.nn.Module.eval(actor.module)
    gaps = []
    padding_zero = True
    for module in (actor.module, frozen.module):
        with torch.no_grad():
            got = response_logprobs(module, sequences, temperature=1.0, device=CPU)
        gap = 0.0
        for row, want in enumerate(wanted):
            steps = len(want)
            gap = max(gap, float((got[row, :steps] - torch.tensor(want)).abs().max()))
            padding_zero &= not got[row, steps:].any()
        gaps.append(gap)
    return gaps[0], gaps[1], padding_zero


def _plain_gradient_norm(model_dir: Path, sequences: Sequences) -> float:
    """The global gradient norm of the same loss on the plain, unwrapped model."""
    model = load_reference_vlm(model_dir)
    freeze_vision_tower(model)
    loss = -response_logprobs(model, sequences, temperature=1.0, device=CPU).sum()
    torch.autograd.backward(loss)
    grads = [p.grad.double() for p in model.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))


def _frozen_tower_step(root: Path, backend_name: str) -> dict[str, object]:
    """Which full weights changed in one step of a policy-gradient-like loss, with the vision
    tower frozen before wrapping, and the step's gradient norm beside the plain model's."""
    model_dir = _prepare(root)
    _, sequences = _rows(model_dir)
    plain_norm = _plain_gradient_norm(model_dir, sequences)
    model = load_generative_model(model_dir, dtype=torch.float32)
    freeze_vision_tower(model)
    actor = _backend(backend_name).prepare_trainable(model, optimizer=OptimizerConfig(lr=1e-2))

    def weights() -> dict[str, torch.Tensor]:
        return {n: t.clone() for bucket in actor.full_weights(1 << 20) for n, t in bucket}

    before = weights()
    logprobs = response_logprobs(actor.module, sequences, temperature=1.0, device=CPU)
    actor.backward(-logprobs.sum())
    report = actor.step()
    assert report.skipped is False
    after = weights()
    moved = sorted(n for n in after if not torch.equal(after[n], before[n]))
    return {
        "names": sorted(after),
        "moved": moved,
        "grad_norm": report.grad_norm,
        "plain_grad_norm": plain_norm,
    }


def _check_frozen(result: dict[str, object]) -> None:
    names, moved_names = result["names"], result["moved"]
    assert isinstance(names, list)
    assert isinstance(moved_names, list)
    moved = set(moved_names)
    # the wrapped step saw the gradients of the plain model (every rank has the same rows)
    assert result["grad_norm"] == pytest.approx(result["plain_grad_norm"], rel=1e-5), result
    tower = [n for n in names if ".visual." in n and ".merger." not in n]
    projector = [n for n in names if ".visual.merger." in n]
    language = [n for n in names if ".language_model." in n]
    assert tower
    assert projector
    assert language
    assert not moved & set(tower), (
        f"frozen vision tower weights moved: {sorted(moved & set(tower))}"
    )
    assert set(projector) <= moved, "the projector must train"
    assert moved & set(language), "the language model must train"


TEXT_ROW = torch.tensor([1])
"""The row of ``_rows`` (here and in the audio tests) without media."""


def uneven_step(
    actor: TrainableModel,
    rows: Sequences,
    wanted: list[list[float]],
    plain: torch.nn.Module,
) -> dict[str, float]:
    """Rank 0 takes every row of ``rows``, every other rank its text row only: the gap of the
    actor's logprobs to ``wanted`` (the reference's), and one step's gradient norm beside the
    plain model's on all ranks' rows (the mean of the ranks' losses, as the backends average)."""
    world = current_rank_context()
    mine, want = (rows, wanted) if world.rank == 0 else (rows.select(TEXT_ROW), [wanted[1]])
    logprobs = response_logprobs(actor.module, mine, temperature=1.0, device=CPU)
    gap = max(
        float((logprobs[row, : len(w)].detach() - torch.tensor(w)).abs().max())
        for row, w in enumerate(want)
    )
    actor.backward(-logprobs.sum())
    report = actor.step()
    losses = [-response_logprobs(plain, rows, temperature=1.0, device=CPU).sum()]
    text = rows.select(TEXT_ROW)
    for _ in range(1, world.world_size):
        losses.append(-response_logprobs(plain, text, temperature=1.0, device=CPU).sum())
    torch.autograd.backward(torch.stack(losses).mean())
    grads = [p.grad.double() for p in plain.parameters() if p.grad is not None]
    plain_norm = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))
    return {"gap": gap, "grad_norm": float(report.grad_norm), "plain_grad_norm": plain_norm}


def check_uneven(results: list[dict[str, float]]) -> None:
    for result in results:
        assert result["gap"] < 2e-5, result
        assert result["grad_norm"] == pytest.approx(result["plain_grad_norm"], rel=1e-5)


def _uneven_ranks(root: Path, backend_name: str) -> dict[str, float]:
    """:func:`uneven_step` over rows with 1, 0, 2 and 1 images, the tower kept running."""
    model_dir = _prepare(root)
    prompts, rows = _rows(model_dir)
    model = load_generative_model(model_dir, dtype=torch.float32)
    assert keep_vision_tower_running(model)
    actor = _backend(backend_name).prepare_trainable(model, optimizer=OptimizerConfig(lr=1e-3))
    return uneven_step(actor, rows, _reference(model_dir, prompts), load_reference_vlm(model_dir))


class _MediaBackendChecks(DistributedSuite):
    @pytest.mark.parametrize("backend", BACKENDS)
    def test_response_logprobs_equal_a_plain_forward(
        self, pool: RankPool, tmp_path: Path, backend: str
    ) -> None:
        root = pool.shared_dir / tmp_path.name
        for actor_gap, reference_gap, padding_zero in pool.run(_logprob_gaps, root, backend):
            assert actor_gap < 2e-5, actor_gap
            assert reference_gap < 2e-5, reference_gap
            assert padding_zero

    @pytest.mark.parametrize("backend", BACKENDS)
    def test_ranks_with_and_without_images(
        self, pool: RankPool, tmp_path: Path, backend: str
    ) -> None:
        check_uneven(pool.run(_uneven_ranks, pool.shared_dir / tmp_path.name, backend))

    @pytest.mark.parametrize("backend", BACKENDS)
    def test_a_frozen_vision_tower_stays_as_loaded(
        self, pool: RankPool, tmp_path: Path, backend: str
    ) -> None:
        root = pool.shared_dir / tmp_path.name
        results = pool.run(_frozen_tower_step, root, backend)
        for result in results:
            _check_frozen(result)
        assert all(result == results[0] for result in results)


class TestMediaBackendsWorld1(_MediaBackendChecks):
    world_size = 1


class TestMediaBackendsWorld2(_MediaBackendChecks):
    world_size = 2
