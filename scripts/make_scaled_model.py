"""Write a random-weight Qwen2 of a given size with the demo's tokenizer and task files, for GRPO
runs that measure step time and memory at scale (the weights are random: the reward stays near 0).

    python scripts/make_scaled_model.py --size 0.5b --output /tmp/qwen2-0.5b
    torchrun --nproc_per_node 4 -m lrft train --pretrain /tmp/qwen2-0.5b \\
        --prompt_data /tmp/qwen2-0.5b/train.jsonl --eval_dataset /tmp/qwen2-0.5b/eval.jsonl \\
        --input_key input --reference_key answer --reward_fn lrft.demos:exact_answer \\
        --enable_engine_sleep --max_steps 8

``0.5b`` is Qwen2-0.5B's body (hidden 896, 24 layers, 14 query / 2 key-value heads, intermediate
4864: 358 M parameters outside the embeddings); with the demo's 258-token vocabulary the embedding
adds almost nothing, so the model has 358 M parameters.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from lrft.demos.task import INPUT_KEY, REFERENCE_KEY, AdditionTask, write_jsonl
from lrft.demos.tokenizer import EOS_ID, MAX_LENGTH, PAD_ID, VOCAB_SIZE, build_tokenizer

SIZES: dict[str, dict[str, int]] = {
    "0.5b": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
    },
    "1.5b": {
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
    },
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="0.5b")
    parser.add_argument(
        "--output", type=Path, required=True, help="folder to create (must not exist)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.output.exists():
        parser.error(f"--output {args.output} exists: give a new folder (nothing is overwritten)")
    config = Qwen2Config(
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=MAX_LENGTH,
        tie_word_embeddings=True,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        bos_token_id=None,
        **SIZES[args.size],
    )
    torch.manual_seed(args.seed)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(args.output)
    build_tokenizer().save_pretrained(args.output)
    task = AdditionTask()
    write_jsonl(args.output / "train.jsonl", task.train_problems())
    write_jsonl(args.output / "eval.jsonl", task.eval_problems())
    parameters = sum(p.numel() for p in model.parameters())
    print(
        f"{args.output}: {parameters / 1e6:.1f} M parameters; keys {INPUT_KEY!r} / {REFERENCE_KEY!r}"
    )


if __name__ == "__main__":
    main()
