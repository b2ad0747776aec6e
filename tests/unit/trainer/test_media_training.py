"""Training on prompts with images, in one process: response logprobs against the plain
transformers reference, the trainer's m-RoPE positions against the engine's, the frozen vision
tower, gradient checkpointing through it, the token budget, rewards that see the images, and
FIRE's continuation requests.

The references are independent: ``lrft.testing.reference`` runs one unpadded sequence at a
time with every media tensor and lets transformers place the tokens itself.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch

from lrft.api import GenerationResult, SamplingParams
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.models.media import freeze_vision_tower, vision_tower
from lrft.rewards import RewardOutput, RewardSample
from lrft.testing.conformance._rollout_media_checks import MediaPrompt, media_prompts
from lrft.testing.reference import load_reference_vlm, media_token_logprobs, token_logprobs
from lrft.testing.vision_models import save_tiny_vlm
from lrft.trainer.experience import ExperienceBatch, ExperienceMaker
from lrft.trainer.logprobs import plain_response_logprobs, response_logprobs
from lrft.trainer.replay import ReplayBuffer
from lrft.trainer.sampling import fire_generate
from lrft.trainer.sequences import Sequences, forward_inputs, pack

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_vlm(tmp_path_factory.mktemp("vlm") / "model")


@pytest.fixture(scope="module")
def prompts(vlm_dir: Path) -> list[MediaPrompt]:
    return media_prompts(vlm_dir, rank=0)  # 1, 0, 2 and 1 images


def _sampled(vlm_dir: Path, prompts: Sequence[MediaPrompt]) -> list[GenerationResult]:
    engine = HFRolloutEngine.from_pretrained(vlm_dir, config=HFEngineConfig(decode="static"))
    params = SamplingParams(temperature=1.0, max_new_tokens=6, seed=3, return_logprobs=True)
    return engine.generate([p.request for p in prompts], params)


def _sequences(results: Sequence[GenerationResult], prompts: Sequence[MediaPrompt]) -> Sequences:
    return pack(results, media=[p.processed for p in prompts])


def _reference_logprobs(
    model: torch.nn.Module, prompt: MediaPrompt, result: GenerationResult
) -> list[float]:
    if prompt.processed is None:
        return token_logprobs(model, result.prompt_token_ids, result.output_token_ids)
    return media_token_logprobs(model, prompt.processed, result.output_token_ids)


def test_response_logprobs_of_image_rows_match_the_reference(
    vlm_dir: Path, prompts: list[MediaPrompt]
) -> None:
    results = _sampled(vlm_dir, prompts)
    sequences = _sequences(results, prompts)
    model = load_reference_vlm(vlm_dir)
    with torch.no_grad():
        fused = response_logprobs(model, sequences, temperature=1.0, device=CPU)
        plain = plain_response_logprobs(model, sequences, temperature=1.0, device=CPU)
    for row, (prompt, result) in enumerate(zip(prompts, results, strict=True)):
        steps = len(result.output_token_ids)
        want = torch.tensor(_reference_logprobs(model, prompt, result), dtype=torch.float32)
        torch.testing.assert_close(fused[row, :steps], want, atol=2e-6, rtol=0)
        torch.testing.assert_close(plain[row, :steps], want, atol=2e-6, rtol=0)
        assert result.logprobs is not None
        torch.testing.assert_close(torch.tensor(result.logprobs), want, atol=2e-6, rtol=0)
        assert not fused[row, steps:].any()  # response tokens only; padding is 0


class _Positions:
    """The (3, rows, columns) positions each forward hands the language model's rotary
    embedding (an m-RoPE model expands 2-D ones to three equal axes first)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls: list[torch.Tensor] = []
        rotary = model.get_submodule("model.language_model.rotary_emb")  # Qwen2-VL's
        self._handle = rotary.register_forward_pre_hook(self._record)

    def _record(self, _: torch.nn.Module, args: tuple[torch.Tensor, torch.Tensor]) -> None:
        self.calls.append(args[1].expand(3, -1, -1).clone())

    def remove(self) -> None:
        self._handle.remove()


def test_the_trainers_positions_are_the_engines(vlm_dir: Path, prompts: list[MediaPrompt]) -> None:
    """Every token the engine fed (prompt at prefill, each generated token but the last at its
    decode step) had, on all three m-RoPE axes, the position the trainer's forward gives it."""
    engine = HFRolloutEngine.from_pretrained(vlm_dir, config=HFEngineConfig(decode="static"))
    seen = _Positions(engine.model)
    params = SamplingParams(temperature=1.0, max_new_tokens=6, seed=5)
    results = engine.generate([p.request for p in prompts], params)
    seen.remove()
    prefill, *steps = seen.calls
    width = prefill.shape[2]
    engine_positions = []
    for row, result in enumerate(results):
        length = len(result.prompt_token_ids)
        fed = [prefill[:, row, width - length :]]
        fed += [step[:, row, :] for step in steps[: len(result.output_token_ids) - 1]]
        engine_positions.append(torch.cat(fed, dim=1))
    sequences = _sequences(results, prompts)
    inputs = forward_inputs(engine.model, sequences, CPU)
    trainer_positions = inputs["position_ids"]
    for row, positions in enumerate(engine_positions):
        assert torch.equal(trainer_positions[:, row, : positions.shape[1]], positions), row
    # the image rows' positions are really 3-D: an image's tokens differ across the axes
    assert not torch.equal(trainer_positions[1, 0], trainer_positions[2, 0])


def test_freeze_vision_tower_keeps_its_weights_and_trains_the_projector(vlm_dir: Path) -> None:
    model = load_reference_vlm(vlm_dir)
    frozen = freeze_vision_tower(model)
    tower = vision_tower(model)
    assert tower is not None
    assert frozen
    assert all(not name.startswith("merger.") for name in frozen)
    assert {name for name, p in tower.named_parameters() if p.requires_grad} == {
        name for name, _ in tower.named_parameters() if name.startswith("merger.")
    }
    prompts = media_prompts(vlm_dir, rank=1)
    sequences = _sequences(_sampled(vlm_dir, prompts), prompts)
    torch.autograd.backward(response_logprobs(model, sequences, temperature=1.0, device=CPU).sum())
    for name, parameter in tower.named_parameters():
        assert (parameter.grad is None) == (name in frozen), name
    merger = tower.get_submodule("merger")
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in merger.parameters())
    with pytest.raises(ValueError, match="has no vision tower"):
        freeze_vision_tower(torch.nn.Linear(2, 2))


def test_gradient_checkpointing_through_the_vision_tower(
    vlm_dir: Path, prompts: list[MediaPrompt]
) -> None:
    sequences = _sequences(_sampled(vlm_dir, prompts), prompts)

    def gradients(checkpointing: bool) -> dict[str, torch.Tensor]:
        model = load_reference_vlm(vlm_dir)
        model.train()
        if checkpointing:
            # transformers 5.24 renamed it; the old name still works, with a warning
            enable = getattr(model, "activation_checkpointing_enable", None)
            (enable or model.gradient_checkpointing_enable)()
        torch.autograd.backward(
            response_logprobs(model, sequences, temperature=1.0, device=CPU).sum()
        )
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    plain, checkpointed = gradients(False), gradients(True)
    assert set(plain) == set(checkpointed)
    assert any("visual.blocks" in name for name in plain)
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, atol=1e-6, rtol=1e-5, msg=name)


def test_the_token_budget_counts_image_patches(vlm_dir: Path, prompts: list[MediaPrompt]) -> None:
    results = _sampled(vlm_dir, prompts)
    sequences = _sequences(results, prompts)
    zeros = torch.zeros(len(results), sequences.action_mask.shape[1])
    buffer = ReplayBuffer(seed=0)
    buffer.append(
        ExperienceBatch(
            sequences=sequences,
            old_logprobs=None,
            ref_logprobs=None,
            scores=torch.zeros(len(results)),
            advantages=zeros,
        )
    )
    tokens = [len(r.prompt_token_ids) + len(r.output_token_ids) for r in results]
    # 56 x 56: 16 patches; 28 x 28 and 84 x 56: 4 + 24; the text prompt none
    assert buffer.row_lengths().tolist() == [
        tokens[0] + 16,
        tokens[1],
        tokens[2] + 28,
        tokens[3] + 16,
    ]


def test_rewards_see_the_prompts_images_and_metadata(
    vlm_dir: Path, prompts: list[MediaPrompt]
) -> None:
    from lrft.data import PromptSample

    seen: list[RewardSample] = []

    class Recording:
        name = "recording"

        def __call__(self, samples: Sequence[RewardSample]) -> RewardOutput:
            seen.extend(samples)
            return RewardOutput(scores=[0.0] * len(samples))

    samples = [
        PromptSample(
            prompt_text="p",
            prompt_token_ids=p.request.prompt_token_ids,
            media=p.request.media,
            metadata={"shape": "square", "row": i},
        )
        for i, p in enumerate(prompts)
    ]
    results = _sampled(vlm_dir, prompts)
    maker = ExperienceMaker(
        engine=HFRolloutEngine.from_pretrained(vlm_dir),
        decode=lambda ids: str(list(ids)),
        reward=Recording(),
        sampling=SamplingParams(),
        estimator="group_norm",
        micro_batch_size=4,
        device=CPU,
    )
    maker.rate(samples, results, 1)
    for sample, prompt, index in zip(seen, prompts, range(len(prompts)), strict=True):
        media = prompt.request.media
        assert sample.images == (() if media is None else media.images)
        assert dict(sample.metadata) == {"shape": "square", "row": index}


def test_fire_continues_image_requests_with_their_media(
    vlm_dir: Path, prompts: list[MediaPrompt]
) -> None:
    engine = HFRolloutEngine.from_pretrained(vlm_dir, config=HFEngineConfig(decode="static"))
    requests = [p.request for p in prompts]
    seen: list[list[object]] = []

    def generate(batch: Sequence[object], params: SamplingParams) -> list[GenerationResult]:
        seen.append(list(batch))
        return engine.generate(batch, params)  # type: ignore[arg-type]  # GenerationRequests

    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=5, seed=1, return_logprobs=True)
    results = fire_generate(generate, requests, params, first_token_temperature=5.0)
    continuations = seen[1]
    model = load_reference_vlm(vlm_dir)
    for result in results:
        prompt = prompts[int(result.request_id[1:])]
        assert result.prompt_token_ids == prompt.request.prompt_token_ids
        if prompt.processed is not None and len(result.output_token_ids) > 1:
            # the rest of the response was generated from the prompt, its first token and the
            # image: its logprobs are the reference's at temperature 1
            want = media_token_logprobs(model, prompt.processed, result.output_token_ids)
            assert result.logprobs is not None
            torch.testing.assert_close(
                torch.tensor(result.logprobs[1:]), torch.tensor(want[1:]), atol=2e-6, rtol=0
            )
    assert any(getattr(r, "media", None) is not None for r in continuations)


def test_the_trainers_vlm_runs_its_tower_on_text_rows_without_changing_them(
    vlm_dir: Path,
) -> None:
    from lrft.config import TrainConfig
    from lrft.trainer.build import causal_lm

    model = causal_lm(TrainConfig(pretrain=str(vlm_dir), prompt_data="p.jsonl", reward_fn="math"))
    tower = vision_tower(model)
    assert tower is not None
    runs: list[int] = []
    tower.register_forward_hook(lambda *_: runs.append(1))
    ids = torch.tensor([[5, 6, 7, 8]])
    logits = model(input_ids=ids).logits
    assert runs == [1]  # a sharded tower's ranks all gather its weights, with or without images
    assert torch.equal(logits, load_reference_vlm(vlm_dir)(input_ids=ids).logits)
    torch.autograd.backward(logits.sum())
    assert all(p.grad is not None and not p.grad.any() for p in tower.parameters())
    prompts = [p for p in media_prompts(vlm_dir, rank=0) if p.processed is not None]
    model(**forward_inputs(model, _sequences(_sampled(vlm_dir, prompts), prompts), CPU))
    assert runs == [1, 1]  # a batch with images runs it once, as transformers does
