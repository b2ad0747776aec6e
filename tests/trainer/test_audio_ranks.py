"""A tiny Qwen2-Audio trained under FSDP2 (and DeepSpeed ZeRO-3, every parameter sharded) on 1
and 2 gloo ranks, and end to end through ``torchrun --nproc_per_node 2 -m lrft train``.

- The actor's and the reference's response logprobs over rows with 0, 1 and 2 audio clips equal
  a plain ``Qwen2AudioForConditionalGeneration`` forward of each unpadded sequence (the
  independent reference, :func:`lrft.testing.reference.media_token_logprobs`); without the
  audio tensors in the forward they are far off, so the rows' features do reach the encoder.
- Ranks whose micro-batches hold clips on one rank and none on the other still compute the
  reference's logprobs and take one step with the plain model's gradient (the rank without
  clips runs the encoder over an idle clip; without it the sharded encoder's collectives
  mismatch).
- One optimizer step with ``freeze_audio_tower`` leaves every encoder weight bit-identical while
  the projector and the language model move, with the gradient norm of the plain model.
- A GRPO run over wav and flac prompts (one at 8 kHz, resampled) on two ranks: one step, the
  engine on the synced weights, an exported model folder that loads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from lrft.api import GenerationResult
from lrft.api.optim import OptimizerConfig
from lrft.backends.train.fsdp2 import FSDP2Backend
from lrft.models.media import freeze_audio_tower, load_generative_model
from lrft.testing.audio_models import save_tiny_audio_lm
from lrft.testing.conformance._rollout_media_checks import AUDIO, MediaPrompt, media_prompts
from lrft.testing.distributed import DistributedSuite, RankPool, current_rank_context
from lrft.testing.reference import load_reference_vlm, media_token_logprobs, token_logprobs
from lrft.trainer.logprobs import response_logprobs
from lrft.trainer.sequences import Sequences, pack
from tests.trainer.fixtures import REWARD_FLAG
from tests.trainer.test_media_backends import BACKENDS, _backend, check_uneven, uneven_step

CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parents[2]
# Response tokens: ordinary byte tokens (never the audio placeholder), different per row.
_RESPONSES = ((65, 66, 67), (70,), (48, 49, 50, 51), (120, 121))


def _prepare(root: Path) -> Path:
    model_dir = root / "model"
    if current_rank_context().rank == 0 and not model_dir.exists():
        save_tiny_audio_lm(model_dir)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
    return model_dir


def _rows(model_dir: Path) -> tuple[list[MediaPrompt], Sequences]:
    prompts = media_prompts(model_dir, rank=0, kind=AUDIO)  # 1, 0, 2 and 1 clips
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


def _gap(got: torch.Tensor, wanted: list[list[float]]) -> float:
    return max(
        float((got[row, : len(want)] - torch.tensor(want)).abs().max())
        for row, want in enumerate(wanted)
    )


def _logprob_gaps(root: Path, backend_name: str) -> dict[str, float]:
    """Largest difference to the reference of the actor's and reference model's response
    logprobs, and of the actor's with the audio left out of its rows."""
    model_dir = _prepare(root)
    prompts, sequences = _rows(model_dir)
    wanted = _reference(model_dir, prompts)
    backend = _backend(backend_name)
    actor = backend.prepare_trainable(
        load_generative_model(model_dir, dtype=torch.float32), optimizer=OptimizerConfig(lr=1e-3)
    )
    frozen = backend.prepare_frozen(load_generative_model(model_dir, dtype=torch.float32))
    torch.nn.Module.eval(actor.module)
    silent = Sequences(
        input_ids=sequences.input_ids,
        attention_mask=sequences.attention_mask,
        prompt_lengths=sequences.prompt_lengths,
        action_mask=sequences.action_mask,
        action_tokens=sequences.action_tokens,
        media=[
            None
            if media is None
            else type(media)(
                prompt_token_ids=media.prompt_token_ids,
                tensors={
                    name: torch.zeros_like(t) if name == "input_features" else t
                    for name, t in media.tensors.items()
                },
                counts=media.counts,
            )
            for media in sequences.media
        ],
    )
    with torch.no_grad():
        actor_lp = response_logprobs(actor.module, sequences, temperature=1.0, device=CPU)
        frozen_lp = response_logprobs(frozen.module, sequences, temperature=1.0, device=CPU)
        silent_lp = response_logprobs(actor.module, silent, temperature=1.0, device=CPU)
    padding = max(float(actor_lp[row, len(want) :].abs().sum()) for row, want in enumerate(wanted))
    return {
        "actor": _gap(actor_lp, wanted),
        "reference": _gap(frozen_lp, wanted),
        "silent": _gap(silent_lp, wanted),
        "padding": padding,
    }


def _plain_gradient_norm(model_dir: Path, sequences: Sequences) -> float:
    model = load_reference_vlm(model_dir)
    freeze_audio_tower(model)
    loss = -response_logprobs(model, sequences, temperature=1.0, device=CPU).sum()
    torch.autograd.backward(loss)
    grads = [p.grad.double() for p in model.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))


def _frozen_tower_step(root: Path) -> dict[str, object]:
    model_dir = _prepare(root)
    _, sequences = _rows(model_dir)
    plain_norm = _plain_gradient_norm(model_dir, sequences)
    model = load_generative_model(model_dir, dtype=torch.float32)
    freeze_audio_tower(model)
    actor = FSDP2Backend().prepare_trainable(model, optimizer=OptimizerConfig(lr=1e-2))

    def weights() -> dict[str, torch.Tensor]:
        return {n: t.clone() for bucket in actor.full_weights(1 << 20) for n, t in bucket}

    before = weights()
    logprobs = response_logprobs(actor.module, sequences, temperature=1.0, device=CPU)
    actor.backward(-logprobs.sum())
    report = actor.step()
    after = weights()
    return {
        "names": sorted(after),
        "moved": sorted(n for n in after if not torch.equal(after[n], before[n])),
        "grad_norm": report.grad_norm,
        "plain_grad_norm": plain_norm,
        "skipped": report.skipped,
    }


def _uneven_ranks(root: Path, backend_name: str) -> dict[str, float]:
    """:func:`uneven_step` over rows with 1, 0, 2 and 1 clips."""
    model_dir = _prepare(root)
    prompts, rows = _rows(model_dir)
    actor = _backend(backend_name).prepare_trainable(
        load_generative_model(model_dir, dtype=torch.float32), optimizer=OptimizerConfig(lr=1e-3)
    )
    return uneven_step(actor, rows, _reference(model_dir, prompts), load_reference_vlm(model_dir))


class _AudioBackendChecks(DistributedSuite):
    @pytest.mark.parametrize("backend", BACKENDS)
    def test_ranks_with_and_without_clips(
        self, pool: RankPool, tmp_path: Path, backend: str
    ) -> None:
        check_uneven(pool.run(_uneven_ranks, pool.shared_dir / tmp_path.name, backend))

    @pytest.mark.parametrize("backend", BACKENDS)
    def test_response_logprobs_equal_a_plain_forward(
        self, pool: RankPool, tmp_path: Path, backend: str
    ) -> None:
        root = pool.shared_dir / tmp_path.name
        for gaps in pool.run(_logprob_gaps, root, backend):
            assert gaps["actor"] < 2e-5, gaps
            assert gaps["reference"] < 2e-5, gaps
            assert gaps["padding"] == 0.0, gaps
            assert gaps["silent"] > 1e-2, f"silencing the clips changed nothing: {gaps}"

    def test_a_frozen_audio_tower_stays_as_loaded(self, pool: RankPool, tmp_path: Path) -> None:
        root = pool.shared_dir / tmp_path.name
        results = pool.run(_frozen_tower_step, root)
        for result in results:
            names, moved = result["names"], result["moved"]
            assert isinstance(names, list)
            assert isinstance(moved, list)
            assert result["skipped"] is False
            assert result["grad_norm"] == pytest.approx(result["plain_grad_norm"], rel=1e-5)
            tower = {n for n in names if n.startswith("model.audio_tower.")}
            projector = {n for n in names if n.startswith("model.multi_modal_projector.")}
            language = {n for n in names if n.startswith("model.language_model.")}
            assert tower
            assert projector
            assert language
            assert not tower & set(moved), f"frozen encoder weights moved: {tower & set(moved)}"
            assert projector <= set(moved), "the projector must train"
            assert language & set(moved), "the language model must train"
        assert all(result == results[0] for result in results)


class TestAudioBackendWorld1(_AudioBackendChecks):
    world_size = 1


class TestAudioBackendWorld2(_AudioBackendChecks):
    world_size = 2


# --- torchrun end to end ------------------------------------------------------------------------


def _sine(seconds: float, rate: int, frequency: float) -> np.ndarray:
    times = np.arange(round(seconds * rate)) / rate
    return (0.4 * np.sin(2 * np.pi * frequency * times)).astype(np.float32)


def _audio_inputs(root: Path) -> tuple[Path, Path]:
    """A tiny Qwen2-Audio and a few prompts whose clips are wav and flac files next to the data,
    one at 8 kHz (the feature extractor's rate is 16 kHz) and one stereo."""
    soundfile = pytest.importorskip("soundfile")
    model = save_tiny_audio_lm(root / "model")
    clips = root / "data" / "clips"
    clips.mkdir(parents=True)
    soundfile.write(clips / "a.wav", _sine(0.3, 16_000, 440.0), 16_000)
    soundfile.write(clips / "b.flac", _sine(0.2, 8_000, 700.0), 8_000, format="FLAC")
    stereo = np.stack([_sine(0.25, 16_000, 300.0), _sine(0.25, 16_000, 900.0)], axis=1)
    soundfile.write(clips / "c.wav", stereo, 16_000)
    rows = [
        {"prompt": "<audio> pitch?", "answer": "1", "audio": ["clips/a.wav"]},
        {"prompt": "how loud?", "answer": "2", "audio": "clips/b.flac"},
        {"prompt": "<audio> vs <audio>", "answer": "3", "audio": ["clips/a.wav", "clips/c.wav"]},
        {"prompt": "no sound", "answer": "4", "audio": []},
    ]
    data = root / "data" / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return model, data


def test_torchrun_trains_a_tiny_audio_model_on_two_ranks(tmp_path: Path) -> None:
    model, data = _audio_inputs(tmp_path)
    save = tmp_path / "out"
    args = [
        "train",
        f"--pretrain={model}",
        f"--prompt_data={data}",
        "--input_key=prompt",
        "--reference_key=answer",
        "--audios_key=audio",
        "--limit_mm_audio_per_prompt=2",
        "--apply_chat_template",
        "--freeze_audio_tower",
        REWARD_FLAG,
        "--n_samples_per_prompt=2",
        "--rollout_batch_size=4",
        "--micro_rollout_batch_size=2",
        "--train_batch_size=8",
        "--micro_train_batch_size=2",
        "--generate_max_len=4",
        "--max_steps=1",
        "--init_kl_coef=0.05",
        "--save_trajectories",
        f"--save_path={save}",
    ]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    port = str(29300 + os.getpid() % 300)
    paths = [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, paths)), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [*torchrun, "--master_port", port, "-m", "lrft", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    exported = load_generative_model(save / "hf_model", dtype=torch.float32)
    original = load_generative_model(model, dtype=torch.float32)
    trained = dict(exported.named_parameters())
    moved = {n for n, p in original.named_parameters() if not torch.equal(p, trained[n])}
    assert any(n.startswith("model.language_model.") for n in moved), "nothing trained"
    assert not any(n.startswith("model.audio_tower.") for n in moved), "the encoder moved"
    records = [
        json.loads(line)
        for step in (save / "trajectories").glob("step_*.jsonl")
        for line in step.read_text().splitlines()
    ]
    named = {tuple(record.get("audio", ())) for record in records}
    # every prompt's clips as the data names them, the text prompt with none
    assert named == {("clips/a.wav",), ("clips/b.flac",), ("clips/a.wav", "clips/c.wav"), ()}
