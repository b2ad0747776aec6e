"""TRL GRPOTrainer throughput on workload VL1 (``lrft bench grpo --workload vl1``'s TRL side), a
vision-language model with images, on one CUDA GPU.

The model, tokenizer, processor and prompts are lrft's own for the workload (``lrft.bench.assets``:
the same random weights in the same folder layout, the same word-token prompts, the same noise
images), so both sides train the same thing: the Qwen2-VL-2B shape with random weights (bf16),
8 prompts x 8 generations = 64 completions of 256 tokens per step (random weights never emit
EOS), each prompt one 448 x 448 image (256 image tokens) and 32 word tokens, micro-batches of 16,
beta 0, lr 1e-6, 4 steps, median of steps 2-4. ``WORKLOAD=vl-tiny`` runs the tiny variant (a
dry run of the script itself, on CPU too, not a measurement).

Needs TRL (``bash scripts/bench_w1_gpu.sh prepare``) and lrft's ``src`` on ``PYTHONPATH``;
prints one JSON line with seconds per step, samples/s, generated tokens/s and peak memory.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from transformers import Qwen2VLForConditionalGeneration, TrainerCallback

from lrft.bench.assets import model_folder, prompt_file, words_end
from lrft.bench.workloads import load_workload
from lrft.data.processor import load_processor

WORKLOAD = os.environ.get("WORKLOAD", "vl1")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _synchronize() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _dataset(prompts: Path) -> Any:
    """lrft's prompt rows as TRL's conversational prompts with their image."""
    from datasets import Dataset

    rows = [json.loads(line) for line in prompts.read_text().splitlines()]
    conversations, images = [], []
    for row in rows:
        text = row["input"].removeprefix("<image>")
        conversations.append(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
        )
        with Image.open(prompts.parent / row["images"]) as image:
            images.append(image.convert("RGB"))
    return Dataset.from_dict({"prompt": conversations, "image": images})


def main() -> None:
    workload = load_workload(WORKLOAD)
    spec = workload.grpo
    assert spec is not None, "a workload with a grpo section"
    assert spec.prompts.images is not None, "a workload whose prompts have images"
    train = spec.train
    work_dir = Path(os.environ.get("WORK_DIR", tempfile.mkdtemp(prefix="trl-vl-")))
    folder = model_folder(workload.model, work_dir)
    prompts = prompt_file(spec.prompts, words_end(workload.model), work_dir)
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    model = Qwen2VLForConditionalGeneration.from_pretrained(folder, dtype=dtype).to(DEVICE)
    processor = load_processor(folder)
    processor.tokenizer.padding_side = "left"
    dataset = _dataset(prompts)

    from trl import GRPOConfig, GRPOTrainer

    def reward_len(completions: list[Any], **_: Any) -> list[float]:
        return [float(len(c if isinstance(c, str) else str(c))) / 1000.0 for c in completions]

    group = int(train["n_samples_per_prompt"])
    rows = int(train["rollout_batch_size"]) * group
    micro = int(train["micro_train_batch_size"])
    steps = int(os.environ.get("STEPS", spec.steps))
    want = dict(
        output_dir=str(work_dir / "trl-out"), per_device_train_batch_size=micro,
        num_generations=group, max_completion_length=int(train["generate_max_len"]),
        max_prompt_length=None, learning_rate=float(train["actor_learning_rate"]),
        bf16=DEVICE == "cuda", use_cpu=DEVICE == "cpu", logging_steps=1, max_steps=steps,
        report_to="none", use_vllm=False, beta=0.0, save_strategy="no",
        gradient_checkpointing=False, temperature=1.0, gradient_accumulation_steps=rows // micro,
        dataloader_num_workers=0,
    )  # fmt: skip
    names = {f.name for f in dataclasses.fields(GRPOConfig)}
    args = GRPOConfig(**{k: v for k, v in want.items() if k in names})

    class StepTimer(TrainerCallback):  # type: ignore[misc]  # transformers' callback base
        def __init__(self) -> None:
            self.seconds: list[float] = []
            self.began = 0.0

        def on_step_begin(self, *_: Any, **__: Any) -> None:
            _synchronize()
            self.began = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            _synchronize()
            self.seconds.append(time.perf_counter() - self.began)

    timer = StepTimer()
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward_len, args=args, train_dataset=dataset,
        processing_class=processor, callbacks=[timer],
    )  # fmt: skip
    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    steady = timer.seconds[spec.steady_from - 1 :] or timer.seconds
    step_s = sorted(steady)[len(steady) // 2]
    import transformers
    import trl

    print(json.dumps({
        "workload": workload.name, "trl": trl.__version__, "transformers": transformers.__version__,
        "torch": torch.__version__, "device": DEVICE,
        "params": sum(p.numel() for p in model.parameters()), "batch_completions": rows,
        "micro_batch": micro, "num_generations": group,
        "completion_len": int(train["generate_max_len"]),
        "step_seconds_all": [round(x, 3) for x in timer.seconds],
        "step_seconds_median_steady": round(step_s, 3), "samples_per_s": round(rows / step_s, 2),
        "gen_tokens_per_s": round(rows * int(train["generate_max_len"]) / step_s, 1),
        "peak_mem_GiB": (
            round(torch.cuda.max_memory_allocated() / 2**30, 2) if DEVICE == "cuda" else None
        ),
        "config_fields_dropped": sorted(k for k in want if k not in names),
    }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
