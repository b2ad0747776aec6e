"""TRL's GRPOTrainer on an ``lrft bench`` text workload: the TRL side of W1, W2 and
``w2-ragged`` (and of ``tiny`` for a dry run on the CPU).

The repository's own version of the reference scripts ``trl_w1.py`` and ``trl_w2.py``: the
same workloads, except that TRL trains on the workload's own model folder and prompt file
(``lrft.bench.assets``: the same random weights, tokenizer and prompts as lrft's run, not a
model and word-level tokenizer of its own), that both sides time and summarise their steps the
same way (``lrft.bench.trl_side``, ``lrft.bench.steps``), and that ``w2-ragged``'s ends are
drawn inside the model's sampling on both sides (``lrft.bench.ragged.EndDraw``).

    python scripts/trl_grpo.py --workload w2 --generation continuous_batching --output trl.json

Needs TRL and lrft's ``src`` on ``PYTHONPATH``; writes the JSON document after every step and
prints its main figures at the end.
"""

from __future__ import annotations

import json
import sys

import torch
from transformers import AutoTokenizer, Qwen2ForCausalLM

from lrft.bench.assets import model_folder, prompt_file, prompt_tokens, words_end
from lrft.bench.trl_side import TrlInputs, TrlRun, model_dtype, script_main


def build(run: TrlRun, device: torch.device) -> TrlInputs | str:
    """The workload's model, tokenizer and prompts (written by lrft's assets when missing)."""
    spec, model_spec = run.grpo, run.workload.model
    if model_spec.vision is not None or spec.prompts.images is not None:
        return "a vision workload: use scripts/trl_vl1.py"
    from datasets import Dataset

    folder = model_folder(model_spec, run.work_dir)
    prompts = prompt_file(spec.prompts, words_end(model_spec), run.work_dir)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = "left"
    texts = [json.loads(line)["input"] for line in prompts.read_text().splitlines()]
    length = prompt_tokens(spec.prompts, model_spec)
    if len(tokenizer(texts[0])["input_ids"]) != length:
        return f"a prompt does not encode to {length} tokens with this transformers version"
    model = Qwen2ForCausalLM.from_pretrained(folder, dtype=model_dtype(run, device))
    return TrlInputs(
        model=model.to(device), processing_class=tokenizer,
        dataset=Dataset.from_dict({"prompt": texts}), eos_token_id=int(tokenizer.eos_token_id),
        prompt_tokens=length,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(script_main("trl_grpo", default_workload="w2", description=__doc__ or "", build=build))
