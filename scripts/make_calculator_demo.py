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

Three stages made the model ``lrft train --demo calculator`` ships (``lrft/demos/calculator/
assets``, whose ``demo.json`` holds each stage's report; docs/multi-turn.md has the commands and
figures): 4000 steps with 30% calling demonstrations teach the syntax; 1000 steps of calling
demonstrations only teach the model to copy operands into the call (greedy held-out accuracy
0.6, every answer calling); 300 steps with 25% calling at a lower rate bring back answering in
the head, so that the model calls on few problems (15% of sampled answers, 70% of those
right) and greedy accuracy is 0.025. RL then finds out that calling pays.

A step trains on the calling and the in-the-head demonstrations as two padded groups (the
short rows are not padded to the long ones' width: 2.4x faster than one padded batch, the same
loss), on one CPU thread by default (``--threads``: two threads on a machine shared with other
jobs made a step 14 times slower, the threads waiting on each other). ``--check-every N``
measures the held-out accuracy every N steps, and ``--stop-accuracy`` ends the stage at the
first check that reaches it.

Writes ``OUTPUT/model`` (the warmed-up model and tokenizer), ``OUTPUT/data/{train,eval}.jsonl``
and ``OUTPUT/warm_up.json`` (settings, the checks, and the held-out call rate and accuracy,
greedy, measured through the episode driver with the hf engine). Run from the repository
root::

    python scripts/make_calculator_demo.py --output /tmp/calc1 --steps 4000 --call-rate 0.3 \
        --batch-size 32 --lr 2e-3 --check-every 200
    python scripts/make_calculator_demo.py --init /tmp/calc1/model --output /tmp/calc2 \
        --steps 1000 --call-rate 1.0 --batch-size 32 --lr 2e-3 --check-every 200
    python scripts/make_calculator_demo.py --init /tmp/calc2/model --output /tmp/calc3 \
        --steps 300 --call-rate 0.25 --batch-size 32 --lr 5e-4 --check-every 100
"""

from __future__ import annotations

import argparse
import copy
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
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch's CPU threads (more than 1 slows a step tenfold on a machine shared with "
        "other jobs: the threads wait on each other)",
    )
    parser.add_argument(
        "--check-every", type=int, default=0, help="measure held-out accuracy every N steps"
    )
    parser.add_argument(
        "--stop-accuracy",
        type=float,
        default=1.0,
        help="stop at the first check whose greedy held-out accuracy reaches this",
    )
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
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The demonstrations of ``problems`` as ``(input_ids, labels)`` groups: those that call
    (about 50 tokens) apart from those that answer in the head (about 12), so that the short rows
    are not padded to the long ones' width; profiling showed the padding was most of a step."""
    encode = tokenizer.encode  # type: ignore[attr-defined]
    groups: dict[bool, list[tuple[list[int], list[int]]]] = {False: [], True: []}
    for problem in problems:
        ids, labels = list(encode(problem.prompt)), [IGNORE_INDEX] * len(encode(problem.prompt))
        call = rng.random() < args.call_rate
        for text, trained in demonstration(problem, call=call, carry_drop=args.carry_drop, rng=rng):
            tokens = list(encode(text)) + ([EOS_ID] if trained else [])
            ids += tokens
            labels += tokens if trained else [IGNORE_INDEX] * len(tokens)
        groups[call].append((ids, labels))
    return [_padded(rows) for rows in groups.values() if rows]


def _padded(rows: Sequence[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, torch.Tensor]:
    # Right padding without an attention mask: a causal model's earlier positions never see it.
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), PAD_ID, dtype=torch.long)
    targets = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    for row, (ids, labels) in enumerate(rows):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        targets[row, : len(labels)] = torch.tensor(labels)
    return input_ids, targets


def token_mean_loss(
    model: torch.nn.Module, groups: Sequence[tuple[torch.Tensor, torch.Tensor]]
) -> torch.Tensor:
    """The next-token cross-entropy averaged over every trained token of all ``groups``: the
    loss of the whole batch in one padded tensor, computed group by group."""
    total = torch.zeros(())
    count = 0
    for input_ids, labels in groups:
        logits: torch.Tensor = model(input_ids=input_ids).logits
        targets = labels[:, 1:]
        total = total + torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
            targets.reshape(-1),
            ignore_index=IGNORE_INDEX,
            reduction="sum",
        )
        count += int((targets != IGNORE_INDEX).sum())
    return total / max(count, 1)


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
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    task = AdditionTask(digits=3, num_train=6000, num_eval=500, seed=args.seed)
    train, evaluation = task.train_problems(), task.eval_problems()
    data = args.output / "data"
    write_jsonl(data / "train.jsonl", train)
    write_jsonl(data / "eval.jsonl", evaluation)
    tokenizer = load_tokenizer()
    model = load_model() if args.init is None else load_model(args.init)
    probe = evaluation[:200]
    before = held_out(  # a copy: the engine freezes its model
        load_model() if args.init is None else load_model(args.init), tokenizer, probe
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98))
    began = time.perf_counter()
    checks: list[dict[str, float]] = []
    step = 0
    while step < args.steps:
        torch.nn.Module.train(model)
        loss = token_mean_loss(
            model, batch(rng.sample(train, args.batch_size), tokenizer, args, rng)
        )
        torch.autograd.backward(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if step % 100 == 0:
            print(f"step {step} loss {loss.item():.3f} ({time.perf_counter() - began:.0f}s)")
        if args.check_every and step % args.check_every == 0:
            torch.nn.Module.eval(model)
            check = {"step": step, **held_out(copy.deepcopy(model), tokenizer, probe)}
            check["seconds"] = round(time.perf_counter() - began, 1)
            checks.append(check)
            print(json.dumps(check), flush=True)
            if check["accuracy"] >= args.stop_accuracy:
                break
    torch.nn.Module.eval(model)
    seconds = time.perf_counter() - began
    after = held_out(copy.deepcopy(model), tokenizer, probe)
    model.save_pretrained(args.output / "model")
    tokenizer.save_pretrained(args.output / "model")
    report = {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "steps": step,
        "warm_up_seconds": round(seconds, 1),
        "checks": checks,
        "held_out_200_greedy": {"start": before, "warmed_up": after},
    }
    (args.output / "warm_up.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
