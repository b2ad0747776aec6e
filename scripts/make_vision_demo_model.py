"""Build the vision demo model shipped in ``src/lrft/demos/vision/assets``: a tiny
Qwen2-VL, its tokenizer and processor files.

A short supervised warm-up on the training scenes (``lrft.demos.vision.task``), with
answers from a sloppy teacher who, when there are two shapes or more, says one too many with
probability ``--overcount`` (fresh coin flips every time a scene is drawn). The model learns to
count, and to overcount about as often as its teacher: greedy decoding then counts only single
shapes right (a fifth of the scenes), while sampling at temperature 1 gives the right count of
the others some of the time. That is the headroom the RL demo shows:
the exact-answer reward teaches the model to say what it sees.

Two stages, as for the addition demo (``scripts/make_demo_model.py``):

1. *learn*: constant learning rate until at least ``--learned-agreement`` of the model's greedy
   answers to 256 training scenes are answers the teacher could give (the count or one more),
   checked every ``--probe-every`` steps, at most ``--max-learn-steps``;
2. *settle*: ``--settle-steps`` more steps with a cosine decay to a tenth of the learning rate.

The images of the training scenes are processed once, up front, by the model's own processor.
Seeded and single-threaded, so the same machine rebuilds the same weights. From the repository
root::

    python scripts/make_vision_demo_model.py     # a few minutes on one CPU core
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import Qwen2VLForConditionalGeneration

from lrft.data import MediaProcessor
from lrft.demos.vision.model import (
    ASSETS_DIR,
    EOS_ID,
    IMAGE_TOKEN_ID,
    model_config,
    save_processor_files,
)
from lrft.demos.vision.task import QUESTION, Scene, ShapeCountTask, sloppy_count

IGNORE_INDEX = -100


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=ASSETS_DIR, help="the model folder")
    parser.add_argument("--batch-size", type=int, default=64, help="scenes per step")
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    parser.add_argument("--warmup", type=int, default=100, help="linear warm-up steps")
    parser.add_argument(
        "--overcount", type=float, default=0.65, help="probability the teacher says one too many"
    )
    parser.add_argument("--learned-agreement", type=float, default=0.95)
    parser.add_argument("--probe-every", type=int, default=100, help="steps between probes")
    parser.add_argument("--max-learn-steps", type=int, default=6000)
    parser.add_argument("--settle-steps", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


class Scenes:
    """The training scenes with their prompts processed once: every prompt has the same ids
    (one template, one image size), so batches need no padding."""

    def __init__(self, scenes: Sequence[Scene], processor: MediaProcessor) -> None:
        text = processor.render([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}])
        processed = [processor.process(text, images=[scene.image()]) for scene in scenes]
        self.scenes = list(scenes)
        self.prompt = torch.tensor(processed[0].prompt_token_ids)
        assert all(p.prompt_token_ids == processed[0].prompt_token_ids for p in processed)
        self.pixels = torch.stack([p.tensors["pixel_values"] for p in processed])
        self.grid = processed[0].tensors["image_grid_thw"]
        self.processor = processor

    def batch(self, indices: Sequence[int], answers: Sequence[str]) -> dict[str, torch.Tensor]:
        """Inputs and labels: prompt, answer, end-of-sequence; loss on the answer and EOS."""
        encoded = [[*self.processor.tokenizer.encode(answer), EOS_ID] for answer in answers]
        width = max(len(e) for e in encoded)
        rows, labels, masks = [], [], []
        for tokens in encoded:
            pad = width - len(tokens)
            rows.append(torch.cat([self.prompt, torch.tensor(tokens + [EOS_ID] * pad)]))
            labels.append(
                torch.tensor([IGNORE_INDEX] * len(self.prompt) + tokens + [IGNORE_INDEX] * pad)
            )
            masks.append(torch.tensor([1] * (len(self.prompt) + len(tokens)) + [0] * pad))
        input_ids = torch.stack(rows)
        return {
            "input_ids": input_ids,
            "attention_mask": torch.stack(masks),
            "labels": torch.stack(labels),
            "pixel_values": self.pixels[list(indices)].flatten(0, 1),
            "image_grid_thw": self.grid.repeat(len(indices), 1),
            "mm_token_type_ids": (input_ids == IMAGE_TOKEN_ID).long(),
        }


@torch.no_grad()
def greedy_answers(
    model: torch.nn.Module, scenes: Scenes, indices: Sequence[int], *, temperature: float = 0.0
) -> list[str]:
    """The model's answer to each scene: up to two tokens, cut at EOS."""
    generator = torch.Generator().manual_seed(0)
    batch = scenes.batch(indices, ["0"] * len(indices))
    ids = batch["input_ids"][:, : len(scenes.prompt)]
    kwargs = {k: batch[k] for k in ("pixel_values", "image_grid_thw")}
    out: list[list[int]] = [[] for _ in indices]
    done = torch.zeros(len(indices), dtype=torch.bool)
    for _ in range(2):
        types = (ids == IMAGE_TOKEN_ID).long()
        logits = model(input_ids=ids, mm_token_type_ids=types, **kwargs).logits[:, -1].float()
        logits[:, IMAGE_TOKEN_ID] = float("-inf")
        if temperature == 0.0:
            token = logits.argmax(-1)
        else:
            token = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=generator)[:, 0]
        for row, value in enumerate(token.tolist()):
            if not done[row] and value != EOS_ID:
                out[row].append(value)
        done |= token == EOS_ID
        ids = torch.cat([ids, token[:, None]], dim=1)
    return [scenes.processor.tokenizer.decode(tokens) for tokens in out]


def agreement(answers: Sequence[str], scenes: Sequence[Scene]) -> float:
    allowed = [{s.answer, str(s.count + 1)} for s in scenes]
    return sum(a in ok for a, ok in zip(answers, allowed, strict=True)) / len(scenes)


def accuracy(answers: Sequence[str], scenes: Sequence[Scene]) -> float:
    return sum(a == s.answer for a, s in zip(answers, scenes, strict=True)) / len(scenes)


def main() -> int:
    args = parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        save_processor_files(folder)
        processor = MediaProcessor.from_pretrained(folder)
    task = ShapeCountTask()
    train = Scenes(task.train_scenes(), processor)
    held_out = Scenes(task.eval_scenes(), processor)
    print(f"processed {len(train.scenes)} + {len(held_out.scenes)} scenes in {time.perf_counter() - start:.0f} s", flush=True)
    model = Qwen2VLForConditionalGeneration(model_config())
    print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters", flush=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    teacher = random.Random(args.seed + 1)
    probe = list(range(256))
    step, learned_at = 0, None
    total = args.max_learn_steps + args.settle_steps

    def rate(step: int) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        if learned_at is None:
            return args.lr
        progress = min(1.0, (step - learned_at) / args.settle_steps)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    while step < total:
        if learned_at is not None and step >= learned_at + args.settle_steps:
            break
        indices = [teacher.randrange(len(train.scenes)) for _ in range(args.batch_size)]
        answers = [sloppy_count(train.scenes[i], teacher, overcount=args.overcount) for i in indices]
        model.train()
        loss = model(**train.batch(indices, answers)).loss
        for group in optimizer.param_groups:
            group["lr"] = rate(step)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        if step % args.probe_every == 0:
            model.eval()
            said = greedy_answers(model, train, probe)
            agree = agreement(said, [train.scenes[i] for i in probe])
            print(f"step {step}: loss {loss.item():.3f} agreement {agree:.3f} ({time.perf_counter() - start:.0f} s)", flush=True)
            if learned_at is None and agree >= args.learned_agreement:
                learned_at = step
        if learned_at is None and step >= args.max_learn_steps:
            print("the model did not learn to count like its teacher", file=sys.stderr)
            return 1
    model.eval()
    every = list(range(len(held_out.scenes)))
    greedy = accuracy(greedy_answers(model, held_out, every), held_out.scenes)
    sampled = accuracy(greedy_answers(model, held_out, every, temperature=1.0), held_out.scenes)
    print(f"held-out greedy accuracy {greedy:.3f}, sampled (T=1) {sampled:.3f}", flush=True)
    output = args.output
    shutil.rmtree(output, ignore_errors=True)
    model.save_pretrained(output)
    save_processor_files(output)
    (output / "demo.json").write_text(
        json.dumps(
            {
                "steps": step,
                "learned_at": learned_at,
                "overcount": args.overcount,
                "held_out_greedy_accuracy": greedy,
                "held_out_sampled_accuracy": sampled,
                "seed": args.seed,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {output} in {time.perf_counter() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
