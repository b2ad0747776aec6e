"""Where a workload's rollout time goes in the hf engine, on one CUDA GPU.

Builds the workload's model (random weights, bf16), serves it with the hf engine as ``lrft
train`` does (``decode`` as given, one chunk of ``micro_rollout_batch_size x
n_samples_per_prompt`` rows) and generates the workload's rollout: prompts of the workload's
length, ``generate_max_len`` new tokens, temperature and top-p as configured, logprobs returned,
no stop id (every row runs to the end). Reports

- the rollout's seconds (median of ``--repeats`` calls after a first one that compiles and
  captures), the prefill alone (a call of one new token) and the decode step they imply;
- the step's bandwidth floor: the bytes of the weights plus the mean live KV cache, read once at
  the device-to-device copy bandwidth measured in the same run (its read+write rate);
- the CUDA kernels of ``--profile_tokens`` decode steps by total device time (torch.profiler),
  on the engine's own path and, with ``--eager_profile``, on the uncompiled static loop;
- with ``--ragged``, rollouts whose responses end at EOS tokens drawn in the sampling at ragged
  lengths (the ``w2-ragged`` workload's law, ``lrft.bench.ragged.EndDraw``) in the same rows: as many sequences as rows (finished
  rows only leave; steps move to fewer rows) and ``--queue`` times as many (finished rows are
  refilled), each against the ideal: its tokens at the uniform rollout's rate.

Prints one JSON object and writes it to ``--out``:

    PYTHONPATH=src python scripts/profile_decode.py --workload w2 --out profile.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from lrft.api import GenerationRequest, SamplingParams
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.bench.assets import prompt_ids, random_model
from lrft.bench.ragged import EndDraw
from lrft.bench.workloads import RaggedSpec, load_workload
from lrft.demos.tokenizer import EOS_ID


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30, repeats: int = 10) -> float:
    """Bytes read plus written per second by a device-to-device copy."""
    source = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        target.copy_(source)
    synchronize(device)
    return 2 * source.numel() * source.element_size() * repeats / (time.perf_counter() - start)


def timed(
    engine: HFRolloutEngine, requests: list[GenerationRequest], params: SamplingParams
) -> float:
    synchronize(engine.device)
    start = time.perf_counter()
    engine.generate(requests, params)
    synchronize(engine.device)
    return time.perf_counter() - start


def kernel_table(
    engine: HFRolloutEngine, requests: list[GenerationRequest], params: SamplingParams, top: int
) -> list[dict[str, Any]]:
    from torch.profiler import ProfilerActivity, profile

    engine.generate(requests, params)  # captures what this length needs, outside the trace
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as trace:
        engine.generate(requests, params)
        synchronize(engine.device)
    events = [e for e in trace.key_averages() if e.device_time_total > 0]
    total = sum(e.self_device_time_total for e in events) or 1.0
    events.sort(key=lambda e: e.self_device_time_total, reverse=True)
    return [
        {
            "kernel": e.key[:120],
            "calls": e.count,
            "device_ms": round(e.self_device_time_total / 1e3, 3),
            "share": round(e.self_device_time_total / total, 4),
        }
        for e in events[:top]
    ]


def ragged_rollouts(
    engine: HFRolloutEngine,
    prompts: list[tuple[int, ...]],
    params: SamplingParams,
    *,
    rows: int,
    queues: list[int],
    full_rate: float,
    repeats: int,
) -> list[dict[str, Any]]:
    """Rollouts of ``rows * queue`` sequences whose responses end at EOS tokens drawn in the
    sampling (``lrft.bench.ragged.EndDraw``, the ``w2-ragged`` law), timed like the uniform one
    (median of ``repeats`` after a first call); the tokens are those of the timed calls."""
    spec = load_workload("w2-ragged").grpo.ragged  # type: ignore[union-attr]  # it has one
    longest = params.max_new_tokens  # the workload's own, where it differs from W2's
    spec = RaggedSpec(min_tokens=min(spec.min_tokens, longest), max_tokens=longest, seed=spec.seed)
    vocab = int(engine.model.get_output_embeddings().weight.shape[0])  # type: ignore[operator]
    draw = EndDraw(
        spec, vocab_size=vocab, prompt_tokens=len(prompts[0]), eos_token_id=EOS_ID,
        device=engine.device,
    )  # fmt: skip
    handle = draw.attach(engine.model)
    single = SamplingParams(
        temperature=params.temperature, top_p=params.top_p, stop_token_ids=(EOS_ID,),
        max_new_tokens=params.max_new_tokens, return_logprobs=True, seed=0,
    )  # fmt: skip
    figures = []
    for queue in queues:
        count = rows * queue
        requests = [
            GenerationRequest(prompt_token_ids=prompts[i % len(prompts)]) for i in range(count)
        ]
        engine.generate(requests, single)
        runs = []
        for _ in range(repeats):
            synchronize(engine.device)
            start = time.perf_counter()
            results = engine.generate(requests, single)
            synchronize(engine.device)
            runs.append((time.perf_counter() - start, [len(r.output_token_ids) for r in results]))
        seconds = statistics.median(t for t, _ in runs)
        lengths = [n for _, found in runs for n in found]
        tokens = sum(lengths) / len(runs)
        ideal = tokens / full_rate
        figures.append({
            "sequences": count, "rows": rows, "tokens": round(tokens, 1),
            "mean_length": round(tokens / count, 1), "longest": max(lengths),
            "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 1),
            "ideal_seconds": round(ideal, 3), "over_ideal": round(seconds / ideal, 2),
        })  # fmt: skip
        print(json.dumps({"ragged": figures[-1]}), flush=True)
    handle.remove()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="w2")
    parser.add_argument(
        "--decode", default="auto", help="the hf engine's path (lrft train's: auto)"
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--profile_tokens", type=int, default=64)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--eager_profile", action="store_true")
    parser.add_argument("--ragged", action="store_true", help="also time ragged rollouts")
    parser.add_argument("--queue", type=int, default=4, help="sequences per row, refilled")
    parser.add_argument("--out", type=Path, default=Path("profile_decode.json"))
    parser.add_argument("--device", default="cuda:0", help="cpu for a dry run of the script")
    args = parser.parse_args()

    workload = load_workload(args.workload)
    assert workload.grpo is not None, f"workload {args.workload} has no grpo section"
    train = dict(workload.grpo.train)
    rows = int(train["micro_rollout_batch_size"]) * int(train["n_samples_per_prompt"])
    new_tokens = int(train["generate_max_len"])
    device = torch.device(args.device)
    spec = workload.model
    prompts = prompt_ids(workload.grpo.prompts, spec.vocab_size)[
        : int(train["micro_rollout_batch_size"])
    ]
    requests = [
        GenerationRequest(prompt_token_ids=tuple(p), request_id=str(i))
        for i, p in enumerate(prompts)
    ]
    params = SamplingParams(
        n=int(train["n_samples_per_prompt"]),
        temperature=float(train.get("temperature", 1.0)),
        top_p=float(train.get("top_p", 1.0)),
        max_new_tokens=new_tokens,
        return_logprobs=True,
        seed=0,
    )
    result: dict[str, Any] = {
        "workload": workload.name,
        "decode": args.decode,
        "rows": rows,
        "new_tokens": new_tokens,
        "torch": torch.__version__,
    }
    bandwidth = copy_bandwidth(device)
    model = random_model(spec, device)
    torch.nn.Module.to(model, torch.bfloat16)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    engine = HFRolloutEngine(
        model,
        config=HFEngineConfig(
            device=device, dtype=torch.bfloat16, max_batch_size=rows, decode=args.decode
        ),
    )
    result["decode"] = engine.decode_path  # what auto resolved to
    start = time.perf_counter()
    engine.generate(requests, params)
    result["first_call_s"] = round(time.perf_counter() - start, 2)
    full = [timed(engine, requests, params) for _ in range(args.repeats)]
    one = SamplingParams(
        n=params.n, temperature=params.temperature, max_new_tokens=1, return_logprobs=True, seed=0
    )
    timed(engine, requests, one)
    prefill = statistics.median(timed(engine, requests, one) for _ in range(3))
    rollout = statistics.median(full)
    step = (rollout - prefill) / (new_tokens - 1)
    prompt_len = len(prompts[0])
    kv_per_token = 2 * spec.num_hidden_layers * spec.num_key_value_heads * spec.head_dim * 2
    mean_live = prompt_len + new_tokens / 2
    kv_bytes = rows * mean_live * kv_per_token
    floor = (weight_bytes + kv_bytes) / bandwidth
    result.update(
        rollout_s=[round(t, 3) for t in full],
        rollout_median_s=round(rollout, 3),
        prefill_s=round(prefill, 4),
        decode_step_ms=round(step * 1e3, 3),
        tokens_per_s=round(rows * new_tokens / rollout, 1),
        copy_bandwidth_GBps=round(bandwidth / 1e9, 1),
        weight_GB=round(weight_bytes / 1e9, 3),
        mean_live_kv_GB=round(kv_bytes / 1e9, 3),
        floor_ms=round(floor * 1e3, 3),
        step_over_floor=round(step / floor, 2),
        peak_GiB=round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        if device.type == "cuda"
        else None,
    )
    print(json.dumps(result), flush=True)
    if args.ragged:
        many = [tuple(p) for p in prompt_ids(workload.grpo.prompts, spec.vocab_size)]
        result["ragged"] = ragged_rollouts(
            engine, many, params, rows=rows, queues=[1, args.queue],
            full_rate=rows * new_tokens / rollout, repeats=args.repeats,
        )  # fmt: skip
    short = SamplingParams(
        n=params.n,
        temperature=params.temperature,
        max_new_tokens=max(args.profile_tokens, 1),
        return_logprobs=True,
        seed=0,
    )
    if args.profile_tokens > 0:
        result["kernels"] = kernel_table(engine, requests, short, args.top)
    engine.shutdown()
    if args.eager_profile and args.profile_tokens > 0:
        model = random_model(spec, device)
        torch.nn.Module.to(model, torch.bfloat16)
        eager = HFRolloutEngine(
            model,
            config=HFEngineConfig(
                device=device, dtype=torch.bfloat16, max_batch_size=rows, decode="static"
            ),
        )
        result["eager_kernels"] = kernel_table(eager, requests, short, args.top)
        eager.shutdown()
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
