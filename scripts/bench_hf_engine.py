"""Time the hf engine's decoding paths on workload W1's generation, on one CUDA GPU.

W1's generation: a Qwen2 config of 387 M parameters (hidden 896, 24 layers, 14 heads / 2 kv heads,
intermediate 4864, vocab 32768, tied embeddings) with random weights (seed 0) in bf16; one call
of 8 prompts of 32 random tokens, n=8 (64 completions), 256 new tokens, temperature 1, logprobs
returned, stop id 1 (random weights never emit it, so every completion is full length).

Each engine path (``HFEngineConfig.decode``) is timed over one engine: a first call (which, for
``cuda_graph``, captures the graph) and then ``--repeats`` calls, of which the median is
reported (``compiled``'s first call includes compiling the step). ``--transformers`` adds
transformers' own alternatives for comparison: ``generate`` with a static cache (which
transformers compiles) and continuous batching (``generate_batch``), both without logprobs.
Figures are set against the floor of reading the weights once per step at the device-to-device
copy bandwidth measured in the same run. Prints one JSON object and writes it to ``--out``.

    PYTHONPATH=src python scripts/bench_hf_engine.py --out bench.json
"""

from __future__ import annotations

import argparse
import functools
import json
import signal
import statistics
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

from lrft.api import GenerationRequest, SamplingParams
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine

VOCAB = 32768
PROMPTS, N, PROMPT_TOKENS, NEW_TOKENS, STOP_ID = 8, 8, 32, 256, 1


def w1_model() -> Qwen2ForCausalLM:
    config = Qwen2Config(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=4096,
        eos_token_id=STOP_ID, pad_token_id=0, bos_token_id=STOP_ID, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    torch.nn.Module.to(model, torch.bfloat16)  # PreTrainedModel re-declares to() untyped
    return model


def w1_requests() -> list[GenerationRequest]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(2, VOCAB, (PROMPTS, PROMPT_TOKENS), generator=generator)
    return [GenerationRequest(prompt_token_ids=row.tolist(), request_id=f"p{i}") for i, row in
            enumerate(ids)]  # fmt: skip


W1_PARAMS = SamplingParams(
    n=N, temperature=1.0, max_new_tokens=NEW_TOKENS, stop_token_ids=(STOP_ID,), seed=0,
    return_logprobs=True,
)  # fmt: skip


def copy_bandwidth(device: torch.device) -> float:
    """Device-to-device copy, bytes read plus written per second (median of 20)."""
    source = torch.randn(256 * 2**20, device=device)  # 1 GiB of fp32
    target = torch.empty_like(source)
    times = []
    for _ in range(25):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # torch
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # torch
        start.record()
        target.copy_(source)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return float(2 * source.numel() * source.element_size() / statistics.median(times[5:]))


def timed(call: Callable[[], Any], repeats: int, device: torch.device) -> dict[str, Any]:
    """Seconds of a first call and the median of ``repeats`` more."""
    seconds = []
    for _ in range(repeats + 1):
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        call()
        torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - start)
    median = statistics.median(seconds[1:])
    tokens = PROMPTS * N * NEW_TOKENS
    return {
        "first_call_s": round(seconds[0], 4),
        "median_s": round(median, 4),
        "all_s": [round(s, 4) for s in seconds[1:]],
        "tokens_per_s": round(tokens / median, 1),
    }


def engine_path(decode: str, device: torch.device, repeats: int) -> dict[str, Any]:
    config = HFEngineConfig(device=device, dtype=torch.bfloat16, max_batch_size=64, decode=decode)
    engine = HFRolloutEngine(w1_model(), config=config)
    requests = w1_requests()
    results: list[Any] = []

    def call() -> None:
        results[:] = engine.generate(requests, W1_PARAMS)

    figures = timed(call, repeats, device)
    assert len(results) == PROMPTS * N
    assert all(len(r.output_token_ids) == NEW_TOKENS for r in results), "a row stopped early"
    figures["decode_path"] = engine.decode_path
    figures["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    engine.shutdown()
    return figures


def transformers_static_generate(device: torch.device, repeats: int) -> dict[str, Any]:
    model = w1_model()
    torch.nn.Module.to(model, device)
    ids = torch.tensor([r.prompt_token_ids for r in w1_requests()], device=device)
    ids = ids.repeat_interleave(N, dim=0)
    config = GenerationConfig(  # type: ignore[no-untyped-call]  # unannotated in transformers
        do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS, eos_token_id=STOP_ID, pad_token_id=0,
        cache_implementation="static", output_logits=False, return_dict_in_generate=True,
    )  # fmt: skip

    def call() -> None:
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                           generation_config=config)  # fmt: skip

    return timed(call, repeats, device)


def transformers_generate_batch(device: torch.device, repeats: int) -> dict[str, Any]:
    model = w1_model()
    torch.nn.Module.to(model, device)
    prompts = [list(r.prompt_token_ids) for r in w1_requests() for _ in range(N)]
    config = GenerationConfig(  # type: ignore[no-untyped-call]  # unannotated in transformers
        do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS, eos_token_id=STOP_ID, pad_token_id=0,
    )  # fmt: skip

    outputs: dict[str, Any] = {}

    def call() -> None:
        # no_grad, not inference_mode: its worker thread updates tensors made here in place.
        with torch.no_grad():
            outputs.clear()
            outputs.update(model.generate_batch(inputs=prompts, generation_config=config))

    figures = timed(call, repeats, device)
    lengths = [len(output.generated_tokens) for output in outputs.values()]
    if lengths != [NEW_TOKENS] * len(prompts):
        raise RuntimeError(f"generate_batch returned {len(lengths)} completions: {lengths[:4]}")
    return figures


class VariantTimeout(Exception):
    pass


def _out_of_time(signum: int, frame: object) -> None:
    raise VariantTimeout("the variant ran past --variant-timeout")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paths", default="generate,static,cuda_graph,compiled",
                        help="comma-separated HFEngineConfig.decode paths to time")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=5, help="timed calls after the first")
    parser.add_argument("--transformers", action="store_true",
                        help="also time transformers' static-cache generate and generate_batch")  # fmt: skip
    parser.add_argument(
        "--variant-timeout", type=int, default=0, help="seconds one variant may take (0: no limit)"
    )
    parser.add_argument("--out", type=Path, help="write the JSON here too")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_hf_engine.py needs a CUDA device")
    device = torch.device("cuda", torch.cuda.current_device())
    signal.signal(signal.SIGALRM, _out_of_time)
    bandwidth = copy_bandwidth(device)
    weight_bytes = sum(p.numel() * p.element_size() for p in w1_model().parameters())
    floor = NEW_TOKENS * weight_bytes / bandwidth
    report: dict[str, Any] = {
        "workload": "W1 generation: 8 prompts x n=8, 32 prompt tokens, 256 new tokens, bf16",
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "copy_bandwidth_tb_s": round(bandwidth / 1e12, 3),
        "weight_gb": round(weight_bytes / 1e9, 3),
        "weight_read_floor_s": round(floor, 4),
        "variants": {},
    }
    repeats = args.repeats
    variants: dict[str, Callable[[], dict[str, Any]]] = {
        f"engine:{path}": functools.partial(engine_path, path, device, repeats)
        for path in args.paths.split(",")
    }
    if args.transformers:
        name = "transformers generate, static cache (compiled)"
        variants[name] = functools.partial(transformers_static_generate, device, repeats)
        name = "transformers generate_batch"
        variants[name] = functools.partial(transformers_generate_batch, device, repeats)
    for name, run in variants.items():
        torch.cuda.reset_peak_memory_stats(device)
        signal.alarm(args.variant_timeout)
        try:
            figures = run()
            figures["times_floor"] = round(figures["median_s"] / floor, 1)
        except Exception as error:  # report and go on: one broken variant must not hide the rest
            figures = {"error": f"{type(error).__name__}: {error}"[:400]}
            traceback.print_exc()
        finally:
            signal.alarm(0)
        report["variants"][name] = figures
        print(name, json.dumps(figures), flush=True)
        torch.cuda.empty_cache()
    text = json.dumps(report, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
