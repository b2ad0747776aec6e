"""Host time of a weight sync per tensor: W1's tensor layout (24 Qwen2 layers, tied embeddings:
290 tensors) at a width so small (hidden 32) that copying and fingerprinting the bytes costs
next to nothing, so what is left is the Python and dispatch work per tensor that every sync pays
whatever the model size. On a GPU this work runs ahead of the kernels it launches; once it
exceeds their time it bounds the sync (W1's 774 MB copy takes ~0.7 ms on an H200, 2.4 us per
tensor).

Runs on the CPU (FSDP2, hf engine in bf16), in one process or under torchrun (each rank gathers
from the gloo group; rank 0 prints one JSON object and writes it to ``--out``):

    PYTHONPATH=src python scripts/bench_sync_host_overhead.py --out overhead.json
    PYTHONPATH=src torchrun --nproc_per_node 2 scripts/bench_sync_host_overhead.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from lrft.api.optim import OptimizerConfig
from lrft.backends.rollout.hf import HFEngineConfig, HFRolloutEngine
from lrft.backends.sync.direct import DirectSync
from lrft.backends.train.fsdp2 import FSDP2Backend, FSDP2Config
from lrft.dist import RankInfo, init_distributed


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("sync_host_overhead.json"))
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("LOCAL_WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29571")
    torch.set_num_threads(1)
    init_distributed(RankInfo.from_env())
    config = Qwen2Config(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=24,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    actor = FSDP2Backend(FSDP2Config()).prepare_trainable(
        Qwen2ForCausalLM(config), optimizer=OptimizerConfig(lr=1e-6)
    )
    engine = HFRolloutEngine(
        Qwen2ForCausalLM(config),
        config=HFEngineConfig(dtype=torch.bfloat16, device=torch.device("cpu")),
    )
    version = [0]

    def sync(verify: bool) -> None:
        version[0] += 1
        DirectSync(verify=verify).sync(actor, engine, version=version[0])

    tensors = len(engine.parameter_specs())
    milliseconds = {
        "gather": _median_ms(lambda: [None for _ in actor.full_weights(256 << 20)], args.repeats),
        "unverified_sync": _median_ms(lambda: sync(False), args.repeats),
        "verified_sync": _median_ms(lambda: sync(True), args.repeats),
        "engine_digest": _median_ms(engine.weights_digest, args.repeats),
    }
    result = {
        "tensors": tensors,
        "milliseconds": milliseconds,
        "microseconds_per_tensor": {k: v * 1e3 / tensors for k, v in milliseconds.items()},
        "torch": torch.__version__,
        "cpu_threads": torch.get_num_threads(),
    }
    result["world_size"] = torch.distributed.get_world_size()
    if torch.distributed.get_rank() == 0:
        text = json.dumps(result, indent=1)
        print(text)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
