"""Prepare the calculator demo of docs/multi-turn.md: 3-digit sums, which the demo model cannot
do in its head, and a copy of the demo model that has seen the calculator's call syntax.

The demo model (``src/lrft/demos/assets``) adds 2-digit numbers and has never seen a tool.
A short supervised warm-up shows it the syntax, as instruction tuning shows a real model its
tools: on 3-digit problems, ``--call-rate`` of the demonstrations call the calculator
(``347+589=`` then ``<calculator>347+589</calculator>``, the tool's ``\\n936\\n``, then ``936``;
only the model's tokens are trained on) and the rest answer in the head, like the demo model's
sloppy teacher who forgets carries (``--carry-drop``). The warmed-up model is meant to call on
few problems and mostly answer wrong, so that RL (``lrft train --environment tool_calls --tools
calculator``) has to find out that calling pays on these problems.

Three stages reach a model that copies (docs/multi-turn.md has the commands and figures): 300
and 600 steps teach the syntax only, 2500 more make greedy held-out accuracy 0.305 with 40% of
answers calling; 20 RL steps on 2 gloo ranks then raise it to 0.745.

Writes ``OUTPUT/model`` (the warmed-up model and tokenizer), ``OUTPUT/data/{train,eval}.jsonl``
and ``OUTPUT/warm_up.json`` (settings and the held-out call rate and accuracy, greedy, measured
through the episode driver with the hf engine). Run from the repository root::

    python scripts/make_calculator_demo.py --output /tmp/calc --steps 300 --batch-size 32 --lr 2e-3
    python scripts/make_calculator_demo.py --init /tmp/calc/model --output /tmp/calc2 ...
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from lrft.agents import EnvironmentSetup, make_environment, run_episodes
from lrft.agents.tools import Calculator
from lrft.api import EpisodeBudget, EpisodeTask, SamplingParams
from lrft.backends.rollout.hf import HFRolloutEngine
from lrft.demos.model import load_model, load_tokenizer
from lrft.demos.task import AdditionTask, Problem, is_correct, sloppy_sum, write_jsonl
from lrft.demos.tokenizer import EOS_ID, PAD_ID

IGNORE_INDEX = -100
OBSERVATION = "\n{content}\n"
"""The tool_calls environment's message format without a chat template (its default)."""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument(
        "--init", type=Path, default=None, help="the model to start from (default: the demo's)"
    )
    parser.add_argument("--steps", type=int, default=600, help="warm-up optimizer steps")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--call-rate", type=float, default=0.2, help="demonstrations that call")
    parser.add_argument("--carry-drop", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def demonstration(
    problem: Problem, *, call: bool, carry_drop: float, rng: random.Random
) -> list[tuple[str, bool]]:
    """``(text, trained)`` segments after the prompt: the model's turns are trained on, the
    tool's output is not."""
    if not call:
        return [(sloppy_sum(problem.a, problem.b, carry_drop=carry_drop, rng=rng), True)]
    expression = f"{problem.a}+{problem.b}"
    return [
        (f"<calculator>{expression}</calculator>", True),
        (OBSERVATION.format(content=problem.answer), False),
        (problem.answer, True),
    ]


def batch(
    problems: Sequence[Problem], tokenizer: object, args: argparse.Namespace, rng: random.Random
) -> tuple[torch.Tensor, torch.Tensor]:
    encode = tokenizer.encode  # type: ignore[attr-defined]
    rows: list[tuple[list[int], list[int]]] = []
    for problem in problems:
        ids, labels = list(encode(problem.prompt)), [IGNORE_INDEX] * len(encode(problem.prompt))
        call = rng.random() < args.call_rate
        for text, trained in demonstration(problem, call=call, carry_drop=args.carry_drop, rng=rng):
            tokens = list(encode(text)) + ([EOS_ID] if trained else [])
            ids += tokens
            labels += tokens if trained else [IGNORE_INDEX] * len(tokens)
        rows.append((ids, labels))
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), PAD_ID, dtype=torch.long)
    targets = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    for row, (ids, labels) in enumerate(rows):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        targets[row, : len(labels)] = torch.tensor(labels)
    return input_ids, targets


def held_out(
    model: torch.nn.Module, tokenizer: object, problems: Sequence[Problem]
) -> dict[str, float]:
    """Greedy episodes with the calculator: accuracy and the share of episodes that called."""
    setup = EnvironmentSetup(
        tokenizer=tokenizer,  # type: ignore[arg-type]
        tools=[Calculator()],
        options={"chat_template": False},
    )
    engine = HFRolloutEngine(model)  # type: ignore[arg-type]
    episodes = run_episodes(
        [EpisodeTask(prompt=p.prompt, reference=p.answer) for p in problems],
        lambda task: make_environment("tool_calls", setup),
        engine.generate,
        SamplingParams(n=1, temperature=0.0, max_new_tokens=40, stop_token_ids=[EOS_ID]),
        EpisodeBudget(max_turns=2, max_total_tokens=64),
    )
    decode = tokenizer.decode  # type: ignore[attr-defined]
    correct = calls = 0
    for episode, problem in zip(episodes, problems, strict=True):
        answer = decode(
            list(episode.turn_token_ids(len(episode.turns) - 1)), skip_special_tokens=True
        )
        correct += is_correct(answer, problem.answer)
        calls += any(turn.metrics.get("tool_calls", 0.0) > 0 for turn in episode.turns)
    return {"accuracy": correct / len(problems), "call_rate": calls / len(problems)}


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    task = AdditionTask(digits=3, num_train=6000, num_eval=500, seed=args.seed)
    train, evaluation = task.train_problems(), task.eval_problems()
    data = args.output / "data"
    write_jsonl(data / "train.jsonl", train)
    write_jsonl(data / "eval.jsonl", evaluation)
    tokenizer = load_tokenizer()
    model = load_model() if args.init is None else load_model(args.init)
    before = held_out(  # a copy: the engine freezes its model
        load_model() if args.init is None else load_model(args.init), tokenizer, evaluation[:200]
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98))
    began = time.perf_counter()
    torch.nn.Module.train(model)
    for step in range(args.steps):
        input_ids, labels = batch(rng.sample(train, args.batch_size), tokenizer, args, rng)
        loss: torch.Tensor = model(input_ids=input_ids, labels=labels).loss
        torch.autograd.backward(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 100 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    torch.nn.Module.eval(model)
    seconds = time.perf_counter() - began
    after = held_out(model, tokenizer, evaluation[:200])
    model.save_pretrained(args.output / "model")
    tokenizer.save_pretrained(args.output / "model")
    report = {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "warm_up_seconds": round(seconds, 1),
        "held_out_200_greedy": {"demo_model": before, "warmed_up": after},
    }
    (args.output / "warm_up.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
