"""Build the demo model shipped in ``src/lrft/demos/assets``: a tiny Qwen2 and its tokenizer.

A short supervised warm-up on the demo task's training problems, with demonstrations from a
sloppy teacher who forgets each carry with probability ``--carry-drop`` (fresh coin flips every
time a problem is drawn). The model learns to add, and to drop carries about as often as its
teacher: greedy decoding then answers only the problems without a carry, while sampling at
temperature 1 answers the others some of the time. That is the headroom the RL demo shows: the
exact-answer reward teaches the model to keep its carries.

Two stages, so that the result does not hinge on when the model finds out how to add (a tiny
transformer sits on a loss plateau for a number of steps that varies widely with the seed):

1. *learn*: constant learning rate until the model answers like its teacher: at least
   ``--learned-agreement`` of its greedy answers to 200 training problems are answers the teacher
   could give (the sum with some of its carries lost), checked every ``--probe-every`` steps, at
   most ``--max-learn-steps``. (Accuracy on carry-free problems alone is not enough: a model can
   add those long before it handles carries in either way.)
2. *settle*: ``--settle-steps`` more steps with a cosine decay to a tenth of the learning rate,
   while the model matches the teacher's carry-dropping rate.

Seeded and single-threaded, so the same machine rebuilds the same weights. Run from the repository
root::

    python scripts/make_demo_model.py            # ~3 min on one CPU core with the defaults
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase, Qwen2ForCausalLM

from lrft.demos.model import ASSETS_DIR, answer_accuracy, complete, model_config
from lrft.demos.task import (
    AdditionTask,
    Problem,
    extract_answer,
    is_correct,
    sloppy_sum,
    teacher_answers,
)
from lrft.demos.tokenizer import EOS_ID, PAD_ID, build_tokenizer

IGNORE_INDEX = -100


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=ASSETS_DIR, help="the model folder")
    parser.add_argument("--batch-size", type=int, default=64, help="problems per step")
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    parser.add_argument("--warmup", type=int, default=100, help="linear warm-up steps")
    parser.add_argument(
        "--carry-drop", type=float, default=0.7, help="probability that the teacher drops a carry"
    )
    parser.add_argument(
        "--learned-agreement",
        type=float,
        default=0.95,
        help="fraction of greedy answers the teacher could give that ends the learn stage",
    )
    parser.add_argument("--probe-every", type=int, default=100, help="steps between probes")
    parser.add_argument("--max-learn-steps", type=int, default=12_000)
    parser.add_argument("--settle-steps", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def demonstration_batch(
    problems: Sequence[Problem],
    tokenizer: PreTrainedTokenizerBase,
    *,
    carry_drop: float,
    rng: random.Random,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids ``prompt + answer + EOS`` (right-padded) and labels on the answer and EOS only."""
    prompts = [tokenizer.encode(p.prompt) for p in problems]
    answers = [
        tokenizer.encode(sloppy_sum(p.a, p.b, carry_drop=carry_drop, rng=rng)) for p in problems
    ]
    sequences = [
        prompt + answer + [EOS_ID] for prompt, answer in zip(prompts, answers, strict=True)
    ]
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(problems), width), PAD_ID, dtype=torch.long)
    labels = torch.full((len(problems), width), IGNORE_INDEX, dtype=torch.long)
    for row, (prompt, sequence) in enumerate(zip(prompts, sequences, strict=True)):
        input_ids[row, : len(sequence)] = torch.tensor(sequence)
        labels[row, len(prompt) : len(sequence)] = torch.tensor(sequence[len(prompt) :])
    return input_ids, labels


def pass_at_k(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    *,
    k: int,
    seed: int,
) -> float:
    """The fraction of problems with at least one exact answer among ``k`` samples at T=1."""
    prompts = [tokenizer.encode(p.prompt) for p in problems for _ in range(k)]
    generator = torch.Generator().manual_seed(seed)
    completions = complete(model, prompts, temperature=1.0, generator=generator)
    responses = tokenizer.batch_decode(completions, skip_special_tokens=True)
    solved = 0
    for index, problem in enumerate(problems):
        group = responses[index * k : (index + 1) * k]
        solved += any(is_correct(r, problem.answer) for r in group)
    return solved / len(problems)


class WarmUp:
    """The supervised warm-up: one optimizer step at a time, at a learning rate set per step."""

    def __init__(self, args: argparse.Namespace, train: Sequence[Problem]) -> None:
        self.args = args
        self.train = train
        self.rng = random.Random(args.seed)
        self.tokenizer = build_tokenizer()
        self.model = Qwen2ForCausalLM(model_config())
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.lr, betas=(0.9, 0.98))
        self.steps = 0

    def step(self, lr: float) -> float:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        input_ids, labels = demonstration_batch(
            self.rng.sample(self.train, self.args.batch_size),
            self.tokenizer,
            carry_drop=self.args.carry_drop,
            rng=self.rng,
        )
        torch.nn.Module.train(self.model)
        loss: torch.Tensor = self.model(input_ids=input_ids, labels=labels).loss
        torch.autograd.backward(loss)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return loss.item()

    def accuracy(self, problems: Sequence[Problem]) -> float:
        torch.nn.Module.eval(self.model)
        return answer_accuracy(self.model, self.tokenizer, problems)

    def teacher_agreement(self, problems: Sequence[Problem]) -> float:
        """The fraction of greedy answers that the sloppy teacher could have given."""
        torch.nn.Module.eval(self.model)
        completions = complete(self.model, [self.tokenizer.encode(p.prompt) for p in problems])
        responses = self.tokenizer.batch_decode(completions, skip_special_tokens=True)
        agreeing = sum(
            extract_answer(response) in teacher_answers(problem)
            for problem, response in zip(problems, responses, strict=True)
        )
        return agreeing / len(problems)


def main() -> None:
    args = parse_args()
    started = time.perf_counter()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    task = AdditionTask()
    train, held_out = task.train_problems(), task.eval_problems()
    probe = train[:200]
    warm_up = WarmUp(args, train)

    def report(stage: str, loss: float) -> None:
        print(
            f"{stage:6s} step {warm_up.steps:5d}  loss {loss:.3f}  "
            f"teacher agreement {warm_up.teacher_agreement(probe):.3f}  "
            f"held-out greedy {warm_up.accuracy(held_out[:200]):.3f}  "
            f"{time.perf_counter() - started:.0f}s",
            flush=True,
        )

    loss = math.nan
    while warm_up.teacher_agreement(probe) < args.learned_agreement or warm_up.steps < args.warmup:
        if warm_up.steps >= args.max_learn_steps:
            sys.exit(
                f"the model did not learn to add within {args.max_learn_steps} steps; "
                "raise --max-learn-steps or try another --seed"
            )
        for _ in range(args.probe_every):
            lr = args.lr * min(1.0, (warm_up.steps + 1) / args.warmup)
            loss = warm_up.step(lr)
        report("learn", loss)
    learned_at = warm_up.steps
    for step in range(args.settle_steps):
        progress = step / args.settle_steps
        loss = warm_up.step(args.lr * (0.1 + 0.45 * (1.0 + math.cos(math.pi * progress))))
        if (step + 1) % 500 == 0:
            report("settle", loss)
    trained = time.perf_counter() - started

    model, tokenizer = warm_up.model, warm_up.tokenizer
    torch.nn.Module.eval(model)
    with_carry = [p for p in held_out if p.has_carry]
    metrics = {
        "held_out_greedy_accuracy": answer_accuracy(model, tokenizer, held_out),
        "held_out_sampled_accuracy": answer_accuracy(
            model, tokenizer, held_out, temperature=1.0, samples=8, seed=args.seed
        ),
        "held_out_pass_at_8": pass_at_k(model, tokenizer, held_out, k=8, seed=args.seed),
        "held_out_carry_free_greedy_accuracy": answer_accuracy(
            model, tokenizer, [p for p in held_out if not p.has_carry]
        ),
        "held_out_carry_sampled_accuracy": answer_accuracy(
            model, tokenizer, with_carry, temperature=1.0, samples=8, seed=args.seed
        ),
        "train_greedy_accuracy": answer_accuracy(model, tokenizer, train[:500]),
    }
    args.output.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.output)
    tokenizer.save_pretrained(args.output)
    recipe = {
        "task": {"digits": task.digits, "num_train": task.num_train, "num_eval": task.num_eval},
        "warm_up": {
            "batch_size": args.batch_size,
            "lr": args.lr,
            "warmup": args.warmup,
            "carry_drop": args.carry_drop,
            "learned_agreement": args.learned_agreement,
            "learned_at_step": learned_at,
            "settle_steps": args.settle_steps,
            "seed": args.seed,
        },
        "metrics": {name: round(value, 4) for name, value in metrics.items()},
    }
    (args.output / "demo.json").write_text(json.dumps(recipe, indent=2) + "\n")
    for path in args.output.iterdir():
        path.chmod(0o644)  # save_pretrained writes the weights owner-only; package data is public
    parameters = sum(p.numel() for p in model.parameters())
    size = sum(f.stat().st_size for f in args.output.iterdir() if f.is_file())
    print(json.dumps(recipe["metrics"]))
    print(
        f"{parameters} parameters, {size / 1e6:.2f} MB in {args.output}; learned to add at step "
        f"{learned_at}, {warm_up.steps} steps in {trained:.0f}s, "
        f"{time.perf_counter() - started:.0f}s in all"
    )


if __name__ == "__main__":
    main()
