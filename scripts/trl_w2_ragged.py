"""TRL GRPOTrainer throughput on workload W2 with ragged responses (``lrft bench --workload
w2-ragged``'s TRL side), on one CUDA GPU.

W2 as in ``trl_w2.py`` (the reference script this one follows: the Qwen2.5-1.5B shape with
random weights, bf16, 16 prompts x 8 generations of at most 1024 tokens per step, prompts of 128
random word tokens, micro-batches of 16, beta 0, lr 1e-6, 4 steps, median of steps 2-4), except
that each completion's length is forced: the ``k``-th completion of the ``c``-th generate call
ends with EOS at ``lrft.bench.ragged.forced_lengths(spec, c, 128)[k]`` tokens, the lengths lrft's
``w2-ragged`` forces (the same spec, read from that workload). A logits processor leaves only
EOS possible at that position; TRL's generate still runs every row until the longest one ends.

Needs TRL (``bash scripts/bench_w1_gpu.sh prepare``) and lrft's ``src`` on ``PYTHONPATH``;
prints one JSON line with seconds per step, samples/s and generated tokens/s (counted from the
completions generate returned).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import time
from typing import Any

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    TrainerCallback,
)

from lrft.bench.ragged import forced_lengths
from lrft.bench.workloads import load_workload

V = 151936
EOS = 1
SPEC = load_workload("w2-ragged").grpo.ragged  # type: ignore[union-attr]  # w2-ragged has one


class ForceLengths(LogitsProcessor):
    """Only EOS may follow at each row's forced length (``lengths[row]`` tokens, EOS last)."""

    def __init__(self, lengths: list[int], prompt_width: int) -> None:
        self.lengths = torch.tensor(lengths)
        self.prompt_width = prompt_width

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        generated = input_ids.shape[1] - self.prompt_width
        last = self.lengths.to(scores.device) == generated + 1
        scores[last] = float("-inf")
        scores[last, EOS] = 0.0
        return scores


def force_lengths(model: Qwen2ForCausalLM) -> list[int]:
    """Wrap ``model.generate`` (TRL calls it on the unwrapped model) to force each call's
    lengths; returns the list each call appends its generated token count to."""
    counts: list[int] = []
    generate = model.generate

    def forced(*args: Any, **kwargs: Any) -> Any:
        input_ids = kwargs["input_ids"]
        lengths = forced_lengths(SPEC, len(counts), input_ids.shape[0])
        processors = LogitsProcessorList([ForceLengths(lengths, input_ids.shape[1])])
        output = generate(*args, logits_processor=processors, **kwargs)
        sequences = output if isinstance(output, torch.Tensor) else output.sequences
        completions = sequences[:, input_ids.shape[1] :]
        ended = completions == EOS
        width = completions.shape[1]
        first = torch.where(ended.any(1), ended.int().argmax(1) + 1, width)
        counts.append(int(first.sum()))
        return output

    model.generate = forced  # type: ignore[method-assign]  # an instance's own generate
    return counts


def main() -> None:
    vocab = {"<pad>": 0, "<eos>": EOS, **{f"w{i}": i for i in range(2, V)}}
    word_level = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    word_level.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=word_level, eos_token="<eos>", pad_token="<pad>")
    tok.padding_side = "left"
    cfg = Qwen2Config(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, vocab_size=V, max_position_embeddings=4096, eos_token_id=EOS,
        pad_token_id=0, bos_token_id=EOS, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    counts = force_lengths(model)

    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    rng = random.Random(0)
    prompts = [" ".join(f"w{rng.randrange(2, V)}" for _ in range(128)) for _ in range(4096)]
    dataset = Dataset.from_dict({"prompt": prompts})

    def reward_len(completions: list[str], **_: Any) -> list[float]:
        return [float(len(c)) / 1000.0 for c in completions]

    rows, group = int(os.environ.get("B", 128)), int(os.environ.get("G", 8))
    steps, micro = int(os.environ.get("STEPS", 4)), int(os.environ.get("MB", 16))
    want = dict(
        output_dir="/tmp/trl-out", per_device_train_batch_size=micro, num_generations=group,
        max_completion_length=SPEC.max_tokens, max_prompt_length=256, learning_rate=1e-6,
        bf16=True, logging_steps=1, max_steps=steps, report_to="none", use_vllm=False, beta=0.0,
        save_strategy="no", gradient_checkpointing=False, temperature=1.0,
        gradient_accumulation_steps=rows // micro, dataloader_num_workers=0,
    )  # fmt: skip
    names = {f.name for f in dataclasses.fields(GRPOConfig)}
    args = GRPOConfig(**{k: v for k, v in want.items() if k in names})

    class StepTimer(TrainerCallback):  # type: ignore[misc]  # transformers' callback base
        def __init__(self) -> None:
            self.seconds: list[float] = []
            self.began = 0.0

        def on_step_begin(self, *_: Any, **__: Any) -> None:
            torch.cuda.synchronize()
            self.began = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            torch.cuda.synchronize()
            self.seconds.append(time.perf_counter() - self.began)

    timer = StepTimer()
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward_len, args=args, train_dataset=dataset,
        processing_class=tok, callbacks=[timer],
    )  # fmt: skip
    torch.cuda.reset_peak_memory_stats()
    trainer.train()
    steady = timer.seconds[1:] or timer.seconds
    step_s = sorted(steady)[len(steady) // 2]
    steady_tokens = counts[1:] or counts  # one generate call per step
    tokens = sorted(steady_tokens)[len(steady_tokens) // 2]
    import transformers
    import trl

    print(json.dumps({
        "workload": "W2-ragged", "trl": trl.__version__, "transformers": transformers.__version__,
        "torch": torch.__version__, "batch_completions": rows, "num_generations": group,
        "ragged": {"min_tokens": SPEC.min_tokens, "max_tokens": SPEC.max_tokens,
                   "seed": SPEC.seed},
        "step_seconds_all": [round(x, 3) for x in timer.seconds],
        "step_seconds_median_steady": round(step_s, 3), "samples_per_s": round(rows / step_s, 2),
        "generated_tokens_per_call": counts, "gen_tokens_per_s": round(tokens / step_s, 1),
        "peak_mem_GiB": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        "config_fields_dropped": sorted(k for k in want if k not in names),
    }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
