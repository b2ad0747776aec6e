"""The end-to-end GRPO part: ``lrft train``'s own trainer on synthetic prompts, step by step.

The trainer is built by :func:`lrft.trainer.build.build_trainer` from a ``TrainConfig`` (the
workload's ``grpo.train`` settings plus the benchmark's model folder, prompt file and length
reward), so what is timed is exactly what ``lrft train`` runs: the same backend, engine, weight
sync, experience maker, policy update and phase lifecycle. Each step is one
:meth:`~lrft.trainer.RLTrainer.train_step`; its phases' times come from the trainer's own
records (``time/<phase>_s``, the device synchronised at each phase's end).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from lrft.api.errors import ConfigError, LrftError
from lrft.bench import flops
from lrft.bench.assets import IMAGES_KEY, model_folder, prompt_file, prompt_tokens, words_end
from lrft.bench.ceilings import synchronize
from lrft.bench.ragged import EndDraw, RecordedLengths, expected_length, full_batch_tokens_per_s
from lrft.bench.rewards import TEXT_LENGTH
from lrft.bench.steps import median, steady_window
from lrft.bench.workloads import GrpoSpec, Workload
from lrft.config import TrainConfig
from lrft.dist import RankInfo
from lrft.redaction import redact

if TYPE_CHECKING:
    from lrft.trainer import RLTrainer

PHASE_ROWS = (
    ("generate", "generate"),
    ("logprobs", "actor_logprobs"),
    ("reference", "reference_logprobs"),
    ("critic values", "critic_values"),
    ("reward", "rewards"),
    ("advantages", "advantages"),
    ("update", "policy"),
    ("critic update", "critic"),
    ("sync", "weight_sync"),
    ("sleep/wake", "sleep_wake"),
)
"""Table rows: (label, phase key); ``generate`` excludes the engine's wake and sleep, which
``sleep/wake`` reports."""


def train_config(workload: Workload, spec: GrpoSpec, *, work_dir: Path, steps: int) -> TrainConfig:
    """The ``lrft train`` settings of the part; writes the model folder and prompt file."""
    return _config(
        spec,
        pretrain=str(model_folder(workload.model, work_dir)),
        prompt_data=str(prompt_file(spec.prompts, words_end(workload.model), work_dir)),
        save_path=str(work_dir / "grpo-output"),
        steps=steps,
    )


def check_train_settings(spec: GrpoSpec, *, world_size: int) -> None:
    """Raise ``ConfigError`` for ``grpo.train`` settings that ``lrft train`` would refuse, before
    anything is written or started."""
    config = _config(spec, pretrain="model", prompt_data="prompts", save_path="out", steps=1)
    config.validate_world(world_size)


def _config(
    spec: GrpoSpec, *, pretrain: str, prompt_data: str, save_path: str, steps: int
) -> TrainConfig:
    # prompts with images: the processor's chat template places them (an ``<image>`` marker)
    images: dict[str, Any] = (
        {}
        if spec.prompts.images is None
        else {"images_key": IMAGES_KEY, "apply_chat_template": True}
    )
    try:
        return TrainConfig(
            **spec.train,
            **images,
            pretrain=pretrain,
            prompt_data=prompt_data,
            reward_fn=TEXT_LENGTH,
            save_path=save_path,
            max_steps=steps,
            save_hf_model=False,
            use_tensorboard=False,
        )
    except TypeError as error:  # an unknown setting
        raise ConfigError(f"grpo.train: {error}") from error


def _phases(metrics: dict[str, float]) -> dict[str, float]:
    phases = {
        key[len("time/") : -len("_s")]: value
        for key, value in metrics.items()
        if key.startswith("time/") and key.endswith("_s")
    }
    wake = phases.pop("engine_wake", 0.0)
    sleep = phases.pop("engine_sleep", 0.0)
    phases["sleep_wake"] = wake + sleep
    if "generate" in phases:
        phases["generate"] -= wake + sleep
    return phases


def run_grpo(
    workload: Workload, *, work_dir: Path, steps: int | None, matmul_tflops: float
) -> dict[str, Any]:
    """Build the trainer, run the steps, and summarise the steady ones. Collective."""
    from lrft.trainer.build import build_trainer

    spec = workload.grpo
    assert spec is not None
    total = steps if steps is not None else spec.steps
    steady_from = min(spec.steady_from, total)
    config = train_config(workload, spec, work_dir=work_dir, steps=total)
    info = RankInfo.from_env()
    trainer = build_trainer(config, info)
    lengths = {sample.prompt_length for sample in trainer.train_data}
    expected = prompt_tokens(spec.prompts, workload.model)
    if lengths != {expected}:
        raise LrftError(
            f"the prompts encode to {sorted(lengths)} tokens, not {expected}: the "
            "benchmark tokenizer (or processor) does not round-trip with this transformers version"
        )
    device = trainer.device
    engine = trainer.maker.engine
    assert engine is not None, "the benchmark runs colocated: every rank holds an engine"
    decode_path = getattr(engine, "decode_path", None)  # the hf engine's
    recorded = draw = None
    if spec.ragged is not None:
        draw = _end_draw(trainer, spec, workload, expected)
        recorded = RecordedLengths(engine)
        trainer.maker.engine = recorded
    trainer.colocation.sync(version=trainer.step)  # as fit() does before the first step
    records = []
    calls = []  # each step's generate calls, as indices into recorded.generated
    for _ in range(total):
        synchronize(device)
        began = time.perf_counter()
        first_call = len(recorded.generated) if recorded is not None else 0
        metrics = trainer.train_step()
        synchronize(device)
        records.append((time.perf_counter() - began, metrics))
        calls.append(range(first_call, len(recorded.generated) if recorded is not None else 0))
    summary = _summary(
        workload, spec, config, trainer.world_size, records, steady_from, matmul_tflops
    )
    summary["engine"] = {"name": engine.name, "decode_path": decode_path}
    if recorded is not None and draw is not None:
        summary["ragged"] = _ragged(
            trainer, draw, recorded, steady_window(calls, steady_from), summary
        )
    return summary


def _end_draw(
    trainer: RLTrainer, spec: GrpoSpec, workload: Workload, prompt_length: int
) -> EndDraw:
    """The ragged ends, hooked into the engine's model (see :mod:`lrft.bench.ragged`)."""
    assert spec.ragged is not None
    engine = trainer.maker.engine
    model = getattr(engine, "model", None)
    if engine is None or not isinstance(model, torch.nn.Module):
        raise ConfigError(
            "grpo.ragged ends responses inside the engine's model: engine "
            f"{getattr(engine, 'name', None)!r} exposes none (use the hf engine)"
        )
    stops = trainer.maker.sampling.stop_token_ids
    if not stops:
        raise LrftError("grpo.ragged needs the tokenizer's EOS among the rollout's stop ids")
    draw = EndDraw(
        spec.ragged,
        vocab_size=workload.model.vocab_size,
        prompt_tokens=prompt_length,
        eos_token_id=stops[0],
        device=trainer.device,
    )
    draw.attach(model)
    return draw


def _ragged(
    trainer: RLTrainer,
    draw: EndDraw,
    recorded: RecordedLengths,
    steady_calls: list[range],
    summary: dict[str, Any],
) -> dict[str, Any]:
    """The ragged variant's figures: this rank's generated lengths over the steady steps, and
    its generate phase against the same tokens at the full batch's rate (measured after the
    steps, with the ends switched off)."""
    spec = draw.spec
    tokens = [sum(sum(recorded.generated[call]) for call in calls) for calls in steady_calls]
    lengths = [n for calls in steady_calls for call in calls for n in recorded.generated[call]]
    stopped = [s for calls in steady_calls for call in calls for s in recorded.stopped[call]]
    full_rate = full_batch_tokens_per_s(trainer, draw)
    per_step = median([float(count) for count in tokens])
    generate_s = summary["phases_seconds_median"].get("generate", 0.0)
    ideal_s = per_step / full_rate
    return {
        "min_tokens": spec.min_tokens,
        "max_tokens": spec.max_tokens,
        "seed": spec.seed,
        "ends": "drawn in the engine's sampling (lrft.bench.ragged.EndDraw)",
        "expected_tokens_mean": expected_length(spec),
        "response_tokens_mean": statistics.fmean(lengths) if lengths else 0.0,
        "response_tokens_max": max(lengths, default=0),
        "ended_at_stop_share": statistics.fmean(stopped) if stopped else 0.0,
        "generated_tokens_per_step": tokens,
        "rollout_tokens_per_s": per_step / generate_s if generate_s > 0 else 0.0,
        "full_batch_tokens_per_s": full_rate,
        "ideal_generate_seconds": ideal_s,
        "generate_over_ideal": generate_s / ideal_s if ideal_s > 0 else 0.0,
    }


def _summary(
    workload: Workload,
    spec: GrpoSpec,
    config: TrainConfig,
    world_size: int,
    records: list[tuple[float, dict[str, float]]],
    steady_from: int,
    matmul_tflops: float,
) -> dict[str, Any]:
    samples = config.samples_per_rollout
    steady = steady_window(records, steady_from)
    step_seconds = median([seconds for seconds, _ in steady])
    phase_names = sorted({name for _, metrics in steady for name in _phases(metrics)})
    phases = {
        name: median([_phases(metrics).get(name, 0.0) for _, metrics in steady])
        for name in phase_names
    }
    response = median([metrics["train/response_length"] for _, metrics in steady])
    prompt = float(prompt_tokens(spec.prompts, workload.model))
    generated = samples * response
    generate_s = phases.get("generate", 0.0)
    update_s = phases.get("policy", 0.0)
    trained_sequences = samples * config.max_epochs
    train_tokens = trained_sequences * (prompt + response)
    train_flops = trained_sequences * flops.training_flops(
        workload.model, sequence_tokens=prompt + response, response_tokens=response
    )
    peaks = [
        value
        for _, metrics in records
        for key, value in metrics.items()
        if key.startswith("memory/") and key.endswith("_peak_mb")
    ]
    return {
        "steps": len(records),
        "steady_steps": list(range(steady_from, len(records) + 1)),
        "samples_per_step": samples,
        "step_seconds": [round(seconds, 6) for seconds, _ in records],
        "step_seconds_median": step_seconds,
        "samples_per_s": samples / step_seconds,
        "phases_seconds_median": phases,
        "old_logprob_pass": "actor_logprobs" in phases,
        "prompt_tokens": prompt,
        "response_tokens_mean": response,
        "generated_tokens_per_step": generated,
        "rollout_tokens_per_s": generated / generate_s if generate_s > 0 else 0.0,
        "end_to_end_generated_tokens_per_s": generated / step_seconds,
        "train_tokens_per_step": train_tokens,
        "train_tokens_per_s": train_tokens / update_s if update_s > 0 else 0.0,
        "train_flops_per_step": train_flops,
        "train_mfu": (
            train_flops / update_s / (world_size * matmul_tflops * 1e12) if update_s > 0 else 0.0
        ),
        "peak_memory_mib": max(peaks) if peaks else None,
        # per phase, the median over the steady steps: the high-water mark inside it (CUDA) and
        # what stays allocated at its end
        "phases_peak_memory_mib": _phase_memory(steady, "_peak_mb"),
        "phases_memory_mib": _phase_memory(steady, "_mb"),
        "reward_mean_last": records[-1][1]["train/reward_mean"],
        "train_config": {key: _plain(value) for key, value in redact(config.as_dict()).items()},
    }


def _phase_memory(steady: list[tuple[float, dict[str, float]]], suffix: str) -> dict[str, float]:
    values: dict[str, list[float]] = {}
    for _, metrics in steady:
        for key, value in metrics.items():
            if key.startswith("memory/") and key.endswith(suffix):
                name = key[len("memory/") : -len(suffix)]
                if suffix == "_mb" and name.endswith("_peak"):
                    continue
                values.setdefault(name, []).append(value)
    return {name: median(found) for name, found in sorted(values.items())}


def _plain(value: object) -> object:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    return str(value)
