"""Time the verified in-place sync's fused kernel against a plain cast copy, on one CUDA GPU.

For a workload's model (random weights, its trainer dtype), each parameter is copied into a
row-aligned bf16 buffer as the hf engine holds its weights, three ways: ``torch._foreach_copy_``
(the cast copy an unverified sync does), ``copy_with_digest`` of the direct sync (the cast copy
that fingerprints what it writes, as a verified sync into an engine that loads in place does),
and the buffer's own digest (the engine's side of the check). Each figure is the median of
``--repeats`` runs between CUDA events (GPU time, including any gaps the host leaves) and of
the host time to issue the same work. Prints one JSON object and writes it to ``--out``.

    PYTHONPATH=src python scripts/bench_copy_digest.py --workload qwen2-1.5b --out copy.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from lrft.backends.sync._copy_plan import copy_with_digest
from lrft.bench.assets import random_model
from lrft.bench.workloads import load_workload
from lrft.kernels import DigestBuffer


def _gpu_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        # torch.cuda.Event's constructor is untyped
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(float(start.elapsed_time(end)))
    return statistics.median(times)


def _host_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        began = time.perf_counter()
        fn()
        times.append((time.perf_counter() - began) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="w1")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("copy_digest.json"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_copy_digest.py needs a CUDA device")
    device = torch.device("cuda", torch.cuda.current_device())
    workload = load_workload(args.workload)
    params = [p.detach() for p in random_model(workload.model, device).parameters()]
    buffer = DigestBuffer([(tuple(p.shape), torch.bfloat16) for p in params], device)
    positions = list(range(len(params)))
    out = torch.zeros((len(params), 2), dtype=torch.int64, device=device)
    cases: dict[str, Callable[[], object]] = {
        "cast_copy": lambda: torch._foreach_copy_(buffer.views, params),
        "copy_with_digest": lambda: copy_with_digest(params, buffer.views, positions, out),
        "buffer_digest": buffer.sums,
    }
    result = {
        "workload": workload.name,
        "tensors": len(params),
        "elements": sum(p.numel() for p in params),
        "source_dtype": str(params[0].dtype),
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "gpu_ms": {name: _gpu_ms(fn, args.repeats) for name, fn in cases.items()},
        "host_ms": {name: _host_ms(fn, args.repeats) for name, fn in cases.items()},
    }
    text = json.dumps(result, indent=1)
    print(text)
    args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
