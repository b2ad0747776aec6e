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

from lrft.api.errors import ConfigError
from lrft.bench.assets import model_folder, prompt_file, prompt_tokens, words_end
from lrft.bench.trl_side import model_dtype, parse_run, run_trl


def main() -> int:
    try:
        run = parse_run(None, default_workload="w2", description=__doc__ or "")
    except ConfigError as error:
        print(f"trl_grpo: configuration error: {error}", file=sys.stderr)
        return 2
    spec, model_spec = run.grpo, run.workload.model
    if model_spec.vision is not None or spec.prompts.images is not None:
        print("trl_grpo: a vision workload: use scripts/trl_vl1.py", file=sys.stderr)
        return 2
    from datasets import Dataset

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    folder = model_folder(model_spec, run.work_dir)
    prompts = prompt_file(spec.prompts, words_end(model_spec), run.work_dir)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = "left"
    texts = [json.loads(line)["input"] for line in prompts.read_text().splitlines()]
    length = prompt_tokens(spec.prompts, model_spec)
    if len(tokenizer(texts[0])["input_ids"]) != length:
        print(f"trl_grpo: a prompt does not encode to {length} tokens", file=sys.stderr)
        return 1
    model = Qwen2ForCausalLM.from_pretrained(folder, dtype=model_dtype(run, device)).to(device)
    document = run_trl(
        run, model=model, processing_class=tokenizer,
        dataset=Dataset.from_dict({"prompt": texts}), eos_token_id=int(tokenizer.eos_token_id),
        prompt_tokens=length,
    )  # fmt: skip
    print(
        f"trl_grpo: {document['configuration']['label']}: "
        f"{document['step_seconds_median']:.3f} s/step (whole loop), "
        f"{document['samples_per_s']:.2f} samples/s; written to {run.output}",
        flush=True,
    )
    return 0 if document["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
