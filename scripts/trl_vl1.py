"""TRL's GRPOTrainer on an ``lrft bench`` vision workload: the TRL side of VL1 (and of
``vl-tiny`` for a dry run on the CPU).

The model, processor and prompts are the workload's own (``lrft.bench.assets``: the same random
weights in the same folder, the same noise images and word-token prompts), so both sides train
the same thing; both time and summarise their steps the same way (``lrft.bench.trl_side``).
TRL 1.16 allows only its ``generate`` path here: it refuses continuous batching for a model
with a processor (``use_transformers_continuous_batching does not support multimodal models``),
so ``--generation continuous_batching`` stops with that message.

    python scripts/trl_vl1.py --workload vl1 --output trl_vl1.json --work_dir /tmp/lrft-bench

Needs TRL and lrft's ``src`` on ``PYTHONPATH``; writes the JSON document after every step and
prints its main figures at the end.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2VLForConditionalGeneration

from lrft.bench.assets import model_folder, prompt_file, prompt_tokens, words_end
from lrft.bench.trl_side import TrlInputs, TrlRun, model_dtype, script_main
from lrft.data.processor import load_processor


def _dataset(prompts: Path) -> Any:
    """lrft's prompt rows as TRL's conversational prompts with their image."""
    from datasets import Dataset
    from PIL import Image

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


def build(run: TrlRun, device: torch.device) -> TrlInputs | str:
    """The workload's model, processor and prompts (written by lrft's assets when missing)."""
    spec, model_spec = run.grpo, run.workload.model
    if spec.prompts.images is None:
        return "a workload whose prompts have no images: use scripts/trl_grpo.py"
    folder = model_folder(model_spec, run.work_dir)
    prompts = prompt_file(spec.prompts, words_end(model_spec), run.work_dir)
    model = Qwen2VLForConditionalGeneration.from_pretrained(folder, dtype=model_dtype(run, device))
    processor = load_processor(folder)
    processor.tokenizer.padding_side = "left"
    return TrlInputs(
        model=model.to(device), processing_class=processor, dataset=_dataset(prompts),
        eos_token_id=int(processor.tokenizer.eos_token_id),
        prompt_tokens=prompt_tokens(spec.prompts, model_spec),
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(script_main("trl_vl1", default_workload="vl1", description=__doc__ or "", build=build))
