"""The TRL side of a side-by-side benchmark, timed and summarised as ``lrft bench`` is.

``scripts/trl_grpo.py`` (text workloads) and ``scripts/trl_vl1.py`` (vision) run TRL's
``GRPOTrainer`` on a workload's own model folder, tokenizer or processor and prompts (the same
random weights and prompts lrft trains on) with the workload's ``grpo.train`` settings, and hand
it to :func:`run_trl`, which:

- times every optimizer step twice (:class:`LoopTimer`): over TRL's callback window
  (``on_step_begin`` to ``on_step_end``, the figure TRL's own step time means) and over the
  whole loop (from the previous step's end to this one's: the dataloader's batch, the step and
  the previous step's logging), which is what ``lrft bench`` times for its own steps, so the
  whole-loop figure is the one a ratio uses;
- wraps the model's ``generate`` and ``generate_batch`` (:class:`GenerationProbe`) to time each
  generation, count its tokens and record the device memory's high-water mark of the generate
  phase and of the rest of the step; with ``grpo.ragged`` it hooks
  :class:`~lrft.bench.ragged.EndDraw` into the model for the call (never into training's
  forward passes);
- summarises the steady steps with :mod:`lrft.bench.steps` (the window and median lrft uses)
  and writes the JSON document after every step, ``complete`` once training ended.

``generation`` picks TRL's generation path: ``generate`` (transformers ``generate``, TRL's
default without vLLM) or ``continuous_batching`` (``use_transformers_continuous_batching``,
transformers' paged continuous batching; TRL 1.16 needs transformers >= 5.8 for it and refuses
it for models with a processor). ``precision`` picks the numerics: ``bf16`` (weights, gradients
and AdamW state in bf16) or ``fp32-master`` (fp32 weights under bf16 autocast: lrft's numerics).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch
from transformers import TrainerCallback

from lrft.api.errors import ConfigError
from lrft.bench.ragged import EndDraw, expected_length
from lrft.bench.report import call_id, git_commit, write_json
from lrft.bench.steps import median, steady_window
from lrft.bench.workloads import GrpoSpec, Workload, load_workload

GENERATIONS = ("generate", "continuous_batching")
PRECISIONS = ("bf16", "fp32-master")
SCHEMA = "lrft.bench.trl/1"


@attrs.frozen(kw_only=True)
class TrlRun:
    """What the TRL side was asked for (one field per command-line argument)."""

    workload: Workload
    generation: str = attrs.field(validator=attrs.validators.in_(GENERATIONS))
    precision: str = attrs.field(validator=attrs.validators.in_(PRECISIONS))
    steps: int
    output: Path
    work_dir: Path

    def __attrs_post_init__(self) -> None:
        if self.workload.grpo is None:
            raise ConfigError(f"workload {self.workload.name!r} has no grpo section")
        if self.generation == "continuous_batching" and self.precision == "fp32-master":
            # TRL 1.16 casts the model to bf16 in place before its continuous-batching call
            # (args.bf16), so fp32 master weights would silently become bf16 weights.
            raise ConfigError(
                "precision 'fp32-master' with generation 'continuous_batching': TRL casts the "
                "model to bf16 before each continuous-batching call; choose one of them"
            )

    @property
    def grpo(self) -> GrpoSpec:
        assert self.workload.grpo is not None
        return self.workload.grpo

    def label(self, device: torch.device) -> str:
        """TRL's configuration in words, as every ratio against it names it."""
        path = "transformers generate" if self.generation == "generate" else "continuous batching"
        if device.type != "cuda":
            numerics = "fp32 (a CPU dry run)"
        elif self.precision == "bf16":
            numerics = "pure bf16 (weights, gradients, AdamW state)"
        else:
            numerics = "fp32 master weights under bf16 autocast"
        return f"TRL GRPOTrainer, {path}, {numerics}"


def parse_run(argv: Sequence[str] | None, *, default_workload: str, description: str) -> TrlRun:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--workload", default=default_workload, help="an lrft bench workload")
    parser.add_argument("--generation", default="generate", choices=GENERATIONS)
    parser.add_argument("--precision", default="bf16", choices=PRECISIONS)
    parser.add_argument("--steps", type=int, help="steps to run (default: the workload's)")
    parser.add_argument("--output", required=True, help="the JSON document's path")
    parser.add_argument("--work_dir", default="/tmp/lrft-bench", help="lrft bench's work dir")
    args = parser.parse_args(argv)
    workload = load_workload(args.workload)
    steps = args.steps if args.steps is not None else (workload.grpo.steps if workload.grpo else 1)
    if steps < 1:
        raise ConfigError(f"--steps must be a positive integer, got {steps}")
    return TrlRun(
        workload=workload, generation=args.generation, precision=args.precision, steps=steps,
        output=Path(args.output), work_dir=Path(args.work_dir),
    )  # fmt: skip


@attrs.frozen(kw_only=True)
class TrlInputs:
    """What a TRL script builds for :func:`run_trl`: the model (on its device), TRL's
    ``processing_class``, the prompt dataset, the EOS id and the prompts' length in tokens."""

    model: torch.nn.Module
    processing_class: Any
    dataset: Any
    eos_token_id: int
    prompt_tokens: int


def script_main(
    name: str,
    *,
    default_workload: str,
    description: str,
    build: Callable[[TrlRun, torch.device], TrlInputs | str],
) -> int:
    """A TRL script's whole command: parse, ``build`` the inputs (or return why not), run,
    print the main figures; 0 when every step ran, 1 when not, 2 for refused settings."""
    try:
        run = parse_run(None, default_workload=default_workload, description=description)
    except ConfigError as error:
        print(f"{name}: configuration error: {error}", file=sys.stderr)
        return 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    inputs = build(run, device)
    if isinstance(inputs, str):
        print(f"{name}: {inputs}", file=sys.stderr)
        return 2
    try:
        document = run_trl(run, inputs)
    except ValueError as error:  # TRL's refusal of a setting
        print(f"{name}: TRL refused the run: {error}", file=sys.stderr)
        return 2
    print(
        f"{name}: {document['configuration']['label']}: "
        f"{document['step_seconds_median']:.3f} s/step (whole loop), "
        f"{document['samples_per_s']:.2f} samples/s; written to {run.output}",
        flush=True,
    )
    return 0 if document["complete"] else 1


def model_dtype(run: TrlRun, device: torch.device) -> torch.dtype:
    """The dtype the model's weights are loaded in."""
    return torch.bfloat16 if device.type == "cuda" and run.precision == "bf16" else torch.float32


def grpo_settings(run: TrlRun, device: torch.device) -> dict[str, Any]:
    """``GRPOConfig`` arguments from the workload's ``grpo.train`` (the fields lrft reads)."""
    train = run.grpo.train
    rows = int(train["rollout_batch_size"]) * int(train["n_samples_per_prompt"])
    micro = int(train["micro_train_batch_size"])
    settings: dict[str, Any] = dict(
        output_dir=str(run.work_dir / "trl-out"), per_device_train_batch_size=micro,
        gradient_accumulation_steps=rows // micro, num_generations=int(train["n_samples_per_prompt"]),
        max_completion_length=int(train["generate_max_len"]), max_prompt_length=None,
        learning_rate=float(train["actor_learning_rate"]), max_grad_norm=float(train.get("max_norm", 1.0)),
        temperature=float(train.get("temperature", 1.0)), top_p=float(train.get("top_p", 1.0)),
        beta=float(train.get("init_kl_coef", 0.0)), seed=int(train.get("seed", 0)),
        bf16=device.type == "cuda", use_cpu=device.type == "cpu", max_steps=run.steps,
        logging_steps=1, report_to="none", save_strategy="no", use_vllm=False,
        gradient_checkpointing=False, dataloader_num_workers=0,
        use_transformers_continuous_batching=run.generation == "continuous_batching",
    )  # fmt: skip
    if run.generation == "continuous_batching" and device.type == "cpu":
        # Sized from the free memory, transformers' paged cache takes ~40 s to set up on a CPU
        # host; a dry run gives it a small fixed one.
        settings["transformers_continuous_batching_config"] = {
            "num_blocks": 64, "max_batch_tokens": 256, _page_size_field(): 16,
        }  # fmt: skip
    return settings


def _page_size_field() -> str:
    """The name of the cache page's size in transformers' ``ContinuousBatchingConfig``:
    ``block_size`` up to 5.17 (the GPU machine's), ``page_size`` in later versions."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    names = {field.name for field in dataclasses.fields(ContinuousBatchingConfig)}
    return "page_size" if "page_size" in names else "block_size"


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_mib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


class GenerationProbe:
    """Wraps ``model.generate`` and ``model.generate_batch`` (TRL calls them on the model it was
    given, unwrapped): per call its seconds, generated tokens and the memory high-water mark,
    and the high-water mark since the last call (read by :meth:`rest_peak`)."""

    def __init__(
        self, model: torch.nn.Module, device: torch.device, eos: int, draw: EndDraw | None
    ) -> None:
        self.device, self.eos, self.draw = device, eos, draw
        self.seconds: list[float] = []
        self.tokens: list[int] = []
        self.peaks: list[float | None] = []
        for name in ("generate", "generate_batch"):
            original = getattr(model, name, None)
            if callable(original):
                setattr(model, name, self._wrapped(model, original, name))

    def _wrapped(
        self, model: torch.nn.Module, original: Callable[..., Any], name: str
    ) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            _synchronize(self.device)
            _reset_peak(self.device)
            handle = self.draw.attach(model) if self.draw is not None else None
            began = time.perf_counter()
            try:
                output = original(*args, **kwargs)
            finally:
                if handle is not None:
                    handle.remove()
            _synchronize(self.device)
            self.seconds.append(time.perf_counter() - began)
            self.peaks.append(_peak_mib(self.device))
            _reset_peak(self.device)
            prompt = kwargs["input_ids"].shape[1] if name == "generate" else 0
            self.tokens.append(self._count(output, prompt))
            return output

        return call

    def _count(self, output: Any, prompt_width: int) -> int:
        """Generated tokens, each completion up to and with its first EOS (what TRL keeps)."""
        if isinstance(output, dict):  # continuous batching: request id -> GenerationOutput
            return sum(len(result.generated_tokens) for result in output.values())
        sequences = output if isinstance(output, torch.Tensor) else output.sequences
        completions = sequences[:, prompt_width:]
        ended = completions == self.eos
        width = completions.shape[1]
        return int(torch.where(ended.any(1), ended.int().argmax(1) + 1, width).sum())

    def rest_peak(self) -> float | None:
        """The high-water mark since the last generate call ended (then reset)."""
        peak = _peak_mib(self.device)
        _reset_peak(self.device)
        return peak


class LoopTimer(TrainerCallback):
    """Each optimizer step's callback-window and whole-loop seconds (see module doc), the
    generate calls it made, and its memory; ``after_step`` runs after each (the JSON write)."""

    def __init__(
        self, device: torch.device, probe: GenerationProbe, after_step: Callable[[], None]
    ) -> None:
        self.device, self.probe, self.after_step = device, probe, after_step
        self.window: list[float] = []
        self.loop: list[float] = []
        self.calls: list[range] = []
        self.rest_peaks: list[float | None] = []
        self._began = self._last_end = 0.0
        self._first_call = 0

    def on_train_begin(self, *_: Any, **__: Any) -> None:
        _synchronize(self.device)
        _reset_peak(self.device)
        self._last_end = time.perf_counter()

    def on_step_begin(self, *_: Any, **__: Any) -> None:
        _synchronize(self.device)
        self._began = time.perf_counter()
        self._first_call = len(self.probe.seconds)

    def on_step_end(self, *_: Any, **__: Any) -> None:
        _synchronize(self.device)
        now = time.perf_counter()
        self.window.append(now - self._began)
        self.loop.append(now - self._last_end)
        self._last_end = now
        self.calls.append(range(self._first_call, len(self.probe.seconds)))
        self.rest_peaks.append(self.probe.rest_peak())
        self.after_step()


def summary(
    run: TrlRun, timer: LoopTimer, probe: GenerationProbe, facts: dict[str, Any]
) -> dict[str, Any]:
    """The steady steps' figures, named as ``lrft bench``'s are where they mean the same."""
    steady_from = min(run.grpo.steady_from, run.steps)
    steps = list(range(1, len(timer.loop) + 1))
    rows = int(run.grpo.train["rollout_batch_size"]) * int(run.grpo.train["n_samples_per_prompt"])
    generate_s = [sum(probe.seconds[i] for i in calls) for calls in timer.calls]
    tokens = [sum(probe.tokens[i] for i in calls) for calls in timer.calls]
    generate_peaks = [
        max((probe.peaks[i] or 0.0 for i in calls), default=0.0) for calls in timer.calls
    ]

    def steady(values: Sequence[float | None]) -> float:
        return median([float(v or 0.0) for v in steady_window(values, steady_from)])

    loop_s, window_s = steady(timer.loop), steady(timer.window)
    generate_median, tokens_median = steady(generate_s), steady([float(t) for t in tokens])
    peaks = [p for p in [*probe.peaks, *timer.rest_peaks] if p is not None]
    document: dict[str, Any] = {
        **facts,
        "configuration": {
            "label": run.label(torch.device(facts["device_type"])),
            "generation": run.generation,
            "precision": run.precision,
        },
        "steps": len(steps),
        "steady_steps": steady_window(steps, steady_from),
        "samples_per_step": rows,
        "step_seconds": [round(s, 6) for s in timer.loop],
        "step_seconds_median": loop_s,
        "samples_per_s": rows / loop_s if loop_s > 0 else 0.0,
        "callback_step_seconds": [round(s, 6) for s in timer.window],
        "callback_step_seconds_median": window_s,
        "callback_samples_per_s": rows / window_s if window_s > 0 else 0.0,
        "generate_seconds": [round(s, 6) for s in generate_s],
        "phases_seconds_median": {"generate": generate_median, "rest": loop_s - generate_median},
        "generated_tokens_per_step": tokens,
        "rollout_tokens_per_s": tokens_median / generate_median if generate_median > 0 else 0.0,
        "end_to_end_generated_tokens_per_s": tokens_median / loop_s if loop_s > 0 else 0.0,
        "peak_memory_mib": max(peaks) if peaks else None,
        "phases_peak_memory_mib": (
            {"generate": steady(generate_peaks), "rest": steady(timer.rest_peaks)} if peaks else {}
        ),
    }
    ragged = run.grpo.ragged
    if ragged is not None:
        document["ragged"] = {
            "min_tokens": ragged.min_tokens, "max_tokens": ragged.max_tokens, "seed": ragged.seed,
            "ends": "drawn in the model's sampling (lrft.bench.ragged.EndDraw)",
            "expected_tokens_mean": expected_length(ragged),
            "response_tokens_mean": tokens_median / rows,
        }  # fmt: skip
    return document


def run_trl(run: TrlRun, inputs: TrlInputs) -> dict[str, Any]:
    """Train ``inputs.model`` with TRL's ``GRPOTrainer`` for ``run.steps`` steps and write the
    document after each (``complete: false``) and at the end."""
    model, eos_token_id = inputs.model, inputs.eos_token_id
    import transformers

    # Any-typed: TRL's own annotations are looser than lrft's (and TRL is an optional extra)
    trl: Any = importlib.import_module("trl")
    GRPOConfig, GRPOTrainer = trl.GRPOConfig, trl.GRPOTrainer  # TRL's class names
    device = next(model.parameters()).device
    wanted = grpo_settings(run, device)
    names = {field.name for field in dataclasses.fields(GRPOConfig)}
    args = GRPOConfig(**{key: value for key, value in wanted.items() if key in names})
    draw = None
    if run.grpo.ragged is not None:
        vocab = int(model.get_output_embeddings().weight.shape[0])  # type: ignore[operator]  # a transformers model
        draw = EndDraw(
            run.grpo.ragged, vocab_size=vocab, prompt_tokens=inputs.prompt_tokens,
            eos_token_id=eos_token_id, device=device,
        )  # fmt: skip
    probe = GenerationProbe(model, device, eos_token_id, draw)
    facts: dict[str, Any] = {
        "schema": SCHEMA, "side": "trl", "workload": run.workload.name, "complete": False,
        "trl": trl.__version__, "transformers": transformers.__version__,
        "torch": torch.__version__, "call": call_id(), "git_commit": git_commit(),
        "device_type": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "params": sum(p.numel() for p in model.parameters()),
        "weights_dtype": str(model_dtype(run, device)).removeprefix("torch."),
        "grpo_config": {key: value for key, value in wanted.items() if key in names and key != "output_dir"},
        "config_fields_dropped": sorted(key for key in wanted if key not in names),
    }  # fmt: skip

    def write() -> None:
        write_json(summary(run, timer, probe, facts), run.output)

    timer = LoopTimer(device, probe, write)

    def reward_length(completions: list[Any], **_: Any) -> list[float]:  # lrft.bench.rewards'
        return [len(_text(completion)) / 1000.0 for completion in completions]

    trainer = GRPOTrainer(
        model=model, reward_funcs=reward_length, args=args, train_dataset=inputs.dataset,
        processing_class=inputs.processing_class, callbacks=[timer],
    )  # fmt: skip
    trainer.train()
    facts["complete"] = len(timer.loop) == run.steps
    document = summary(run, timer, probe, facts)
    write_json(document, run.output)
    return document


def _text(completion: Any) -> str:
    """A completion's text: TRL passes a string, or for conversational prompts the assistant's
    messages."""
    if isinstance(completion, str):
        return completion
    return "".join(str(message.get("content", "")) for message in completion)
